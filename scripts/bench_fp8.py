"""Float8 matrix products on this GPU, at the `gpu` recipe's shapes: are they worth it?

Prints what torch offers (`F.scaled_mm`, its scaling names), then three tables: each matrix
product of a training step in bf16 and in float8 (one scale a tensor), the cost of casting an
activation to float8, and the recipe's MLP and attention projections forward and backward,
compiled, in bf16, in float8 throughout (e4m3 forward, e5m2 gradients, every scale from its
tensor's largest entry) and in float8 only for the forward products of normed inputs (q, k, v,
MLP up; a fixed scale), with their error against float32. The float8 linears are copies of the
ones tried in train.py (docs/trainer.md), which cannot be imported. Needs a Hopper GPU or
later; writes nothing.

    python scripts/bench_fp8.py [products] [casts] [modules]    # all three if none named
"""

from __future__ import annotations

import sys
from functools import partial

import torch
import torch.nn.functional as F

TOKENS, DIM, HIDDEN, VOCAB = 128 * 2048, 512, 2048, 8192  # the gpu recipe's step
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def bench(fn) -> float:
    """Median milliseconds of fn() over repeats (triton's do_bench: CUDA events, L2 flushed)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200, return_mode="median")


# --- the float8 linears tried in train.py ----------------------------------------------------
TENSORWISE = F.ScalingType(0)


@torch.compiler.allow_in_graph  # torch 2.11's compiler cannot trace into scaled_mm (a graph break without this)
def fp8_matmul(a, b, scale_a, scale_b, dtype=torch.bfloat16, fast=True):
    return F.scaled_mm(
        a, b, scale_a, TENSORWISE, scale_b, TENSORWISE, output_dtype=dtype, use_fast_accum=fast
    )


def to_fp8(x, dtype):
    scale = x.abs().amax().float().clamp_min(1e-30) / torch.finfo(dtype).max
    return (x.float() / scale).to(dtype), scale


class Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        xq, xs = to_fp8(x.flatten(0, -2), E4M3)
        wq, ws = to_fp8(weight, E4M3)
        ctx.save_for_backward(xq, xs, wq, ws)
        return fp8_matmul(xq, wq.T, xs, ws).unflatten(0, x.shape[:-1])

    @staticmethod
    def backward(ctx, grad):
        xq, xs, wq, ws = ctx.saved_tensors
        gq, gs = to_fp8(grad.flatten(0, -2), E5M2)
        grad_x = fp8_matmul(gq, wq.T.contiguous().T, gs, ws, fast=False)
        grad_w = fp8_matmul(gq.T.contiguous(), xq.T.contiguous().T, gs, xs, torch.float32, False)
        return grad_x.unflatten(0, grad.shape[:-1]), grad_w


class Fp8NormedLinear(torch.autograd.Function):
    """The forward product only, for an rms-normed x: x by a fixed scale, the weight by its own."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        x_scale = torch.full((), x.size(-1) ** 0.5 / 448, device=x.device)
        w_scale = weight.abs().amax().clamp_min(1e-30) / 448
        xq = (x.flatten(0, -2).float() / x_scale).to(E4M3)
        wq = (weight / w_scale).to(E4M3)
        return fp8_matmul(xq, wq.T, x_scale, w_scale).unflatten(0, x.shape[:-1])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_w = grad.flatten(0, -2).T @ x.flatten(0, -2)
        return grad @ weight.to(grad.dtype), grad_w.float()


def linear(x, weight, mode, normed=False):
    """mode: 'bf16', 'fp8' (every product) or 'fp8 forward' (forward products of normed inputs)."""
    if mode == "fp8":
        return Fp8Linear.apply(x, weight)
    if mode == "fp8 forward" and normed:
        return Fp8NormedLinear.apply(x, weight)
    return F.linear(x, weight)


def mlp(x, up, down, mode):
    x = F.rms_norm(x, (DIM,))
    return linear(F.relu(linear(x, up, mode, True)).square(), down, mode)


def projections(x, q, k, v, out, mode):
    """q, k and v of the normed input, a stand-in for attention between them, then the output."""
    x = F.rms_norm(x, (DIM,))
    return linear(
        linear(x, q, mode, True) * linear(x, k, mode, True) + linear(x, v, mode, True), out, mode
    )


# ---------------------------------------------------------------------------------------------


def product_times(m: int, k: int, n: int) -> list[float]:
    """Milliseconds of one M x K @ K x N product in bf16, float8 with fast accumulation, float8."""
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16()
    aq, bq, one = a.to(E4M3), b.to(E4M3), torch.ones((), device="cuda")
    return [
        bench(lambda: a @ b.T),
        bench(lambda: F.scaled_mm(aq, bq.T, one, TENSORWISE, one, TENSORWISE, use_fast_accum=True)),
        bench(lambda: F.scaled_mm(aq, bq.T, one, TENSORWISE, one, TENSORWISE)),
    ]


def products() -> None:
    print("\nmatrix products (M x K @ K x N), median ms and TFLOP/s")
    print(f"{'what':22} {'M':>7} {'K':>7} {'N':>6} {'bf16':>13} {'fp8 fast acc':>14} {'fp8':>14}")
    shapes = [
        ("up forward", TOKENS, DIM, HIDDEN),
        ("down forward", TOKENS, HIDDEN, DIM),
        ("q/k/v/out forward", TOKENS, DIM, DIM),
        ("up weight grad", HIDDEN, TOKENS, DIM),
        ("down weight grad", DIM, TOKENS, HIDDEN),
        ("q/k/v/out weight grad", DIM, TOKENS, DIM),
        ("head forward, a slice", TOKENS // 4, DIM, VOCAB),
    ]
    for name, m, k, n in shapes:
        cells = [f"{ms:6.3f} {2 * m * k * n / ms / 1e9:6.0f}" for ms in product_times(m, k, n)]
        print(f"{name:22} {m:>7} {k:>7} {n:>6} {cells[0]:>13} {cells[1]:>14} {cells[2]:>14}")


def casts() -> None:
    print("\ncasting a bf16 activation to float8 (amax, scale, cast), compiled, median ms")
    cast = torch.compile(lambda x: to_fp8(x, E4M3), dynamic=False)
    cast_t = torch.compile(lambda x: to_fp8(x, E4M3)[0].T.contiguous(), dynamic=False)
    for width in (DIM, HIDDEN):
        x = torch.randn(TOKENS, width, device="cuda").bfloat16()
        gb = x.numel() * 3 / 1e9  # read 2 bytes, write 1
        ms, ms_t = bench(partial(cast, x)), bench(partial(cast_t, x))
        print(
            f"{TOKENS} x {width}: {ms:.3f} ms ({gb / ms:.2f} TB/s at one read and one write); "
            f"cast and transpose {ms_t:.3f} ms"
        )


def step_time(fn, x, ws, grad, mode, ref) -> tuple[float, str]:
    """Median ms of fn's forward and backward, compiled, in `mode`, and its gradients' errors."""
    step = torch.compile(lambda: fn(x, *ws, mode).backward(grad), dynamic=False)

    def again():
        for t in [x, *ws]:
            t.grad = None
        step()

    with torch.autocast("cuda", dtype=torch.bfloat16):
        again()
        got = [x.grad.float()] + [w.grad for w in ws]
        errors = ", ".join(
            f"{(g - r).norm() / r.norm():.4f}" for g, r in zip(got, ref, strict=True)
        )
        return bench(again), errors


def modules() -> None:
    print("\nforward and backward, compiled, bf16 autocast, median ms; error against float32")
    torch.manual_seed(0)
    x = torch.randn(128, 2048, DIM, device="cuda").bfloat16().requires_grad_()
    bound = (3 / DIM) ** 0.5
    weights = {
        "mlp": [
            torch.empty(HIDDEN, DIM, device="cuda").uniform_(-bound, bound),
            torch.empty(DIM, HIDDEN, device="cuda").uniform_(-bound / 2, bound / 2),
        ],
        "projections": [
            torch.empty(DIM, DIM, device="cuda").uniform_(-bound, bound) for _ in range(4)
        ],
    }
    for name, fn in (("mlp", mlp), ("projections", projections)):
        ws = [w.requires_grad_() for w in weights[name]]
        grad = torch.randn(128, 2048, DIM, device="cuda").bfloat16()
        x.grad = None
        for w in ws:
            w.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=False):  # the reference
            fn(x.float(), *ws, "bf16").backward(grad.float())
        ref = [x.grad.float().clone()] + [w.grad.clone() for w in ws]
        times = {}
        for mode in ("bf16", "fp8", "fp8 forward"):
            times[mode], errors = step_time(fn, x, ws, grad, mode, ref)
            print(
                f"{name:12} {mode:11} {times[mode]:7.3f} ms = {times[mode] / times['bf16']:.3f} x bf16   "
                f"gradient errors (x, weights): {errors}"
            )


def main() -> None:
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}, cuBLAS {torch.backends.cuda.preferred_blas_library()}"
    )
    print(
        f"F.scaled_mm: {'scaled_mm' in dir(F)}; scaling types: {[s for s in dir(F.ScalingType) if s[0] != '_']}"
    )
    parts = sys.argv[1:] or ["products", "casts", "modules"]
    for part in parts:
        {"products": products, "casts": casts, "modules": modules}[part]()


if __name__ == "__main__":
    main()
