"""Time PyTorch's attention backends on the gpu profile's attention: which kernel SDPA picks, and how fast each is.

One causal scaled-dot-product attention of the baseline's shape (128 sequences x 4 heads x 2,048
positions x 128 dims, bf16), forward and forward plus backward, through each SDPA backend, as
the median of repeated runs. TFLOP/s count the causal half of the work (the backward as 2.5
forwards). Then the CUDA kernels the default choice runs. Needs a CUDA GPU and Triton.

    python scripts/bench_attention.py
    python scripts/bench_attention.py --batch 64 --heads 8 --head-dim 64
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

BACKENDS = ["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    shape = (args.batch, args.heads, args.seq, args.head_dim)
    print(
        f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}, {shape}"
    )
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    forward_flops = 4 * args.batch * args.heads * args.seq**2 * args.head_dim / 2

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        forward().backward(grad)

    reference = None
    for name in ["default", *BACKENDS]:
        chosen = (
            contextlib.nullcontext()
            if name == "default"
            else sdpa_kernel([getattr(SDPBackend, name)])
        )
        try:
            with chosen:
                out = forward().detach().float()
                reference = out if reference is None else reference
                error = ((out - reference).norm() / reference.norm()).item()
                fwd = do_bench(forward, warmup=50, rep=200, return_mode="median")
                fwd_bwd = do_bench(
                    both, warmup=50, rep=300, grad_to_none=[q, k, v], return_mode="median"
                )
        except RuntimeError as exc:
            print(f"{name:20} refused: {str(exc).splitlines()[0][:160]}")
            continue
        print(
            f"{name:20} forward {fwd:7.2f} ms {forward_flops / fwd / 1e9:5.0f} TFLOP/s | forward+backward "
            f"{fwd_bwd:7.2f} ms {3.5 * forward_flops / fwd_bwd / 1e9:5.0f} TFLOP/s | error against default {error:.1e}"
        )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        both()
        torch.cuda.synchronize()
    kernels = sorted(
        {e.name for e in prof.events() if e.device_type.name == "CUDA" and "Memset" not in e.name}
    )
    print("the default's kernels:")
    for name in kernels:
        print("  " + name[:120])


if __name__ == "__main__":
    main()
