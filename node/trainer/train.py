"""The baseline training script: a small modern GPT, trained on a fixed budget of tokens.

This is the file the research agents edit. It gets its data, its clock and its score from the
harness (`session()`): it trains on `S.batches(...)` until they stop, then hands the model to
`S.finish(model)`, which computes val_bpb. It never reads data files or reports its own score.
Its schedule follows `S.progress()`, the share of the budget's tokens served, so a run of one
seed gives the same model on any machine of the profile's device class, however busy.

The `gpu` profile trains a richer recipe than the `cpu` and `test` profiles: a wide, shallow model
(4 blocks of width 1024) on a batch of 2^17 tokens a step, value embeddings, a skip from the embedding into every block, NorMuon with
cautious weight decay and Polar Express coefficients, a momentum warm-up, higher learning rates,
no updates from the harness's warm-up batches (docs/trainer.md: what was measured, and what was
not). `GPU` switches each of those; on the CPU profiles the file trains exactly as the simpler
recipe did. Under autocast (training on a GPU) the residual stream is kept in bf16, and on the
`gpu` profile the loss and its gradient come from one pass over the logits (`SoftcapCrossEntropy`),
a training step's forward products of normed inputs run in float8 (`Fp8NormedLinear`, and the
logits'), and the whole model is compiled as one graph.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from node.trainer.harness import session

S = session()

# ---------------------------------------------------------------------------------------------
# Hyperparameters

GPU = S.profile_name == "gpu"  # the gpu recipe; the cpu and test profiles keep the simpler one
# Model size and batch per profile: (depth, width, head dim, sequences per micro-batch, micro-batches per step)
DEPTH, MODEL_DIM, HEAD_DIM, DEVICE_BATCH, GRAD_ACCUM = {
    "gpu": (4, 1024, 128, 64, 1),
    "cpu": (4, 128, 64, 16, 1),
    "demo": (4, 128, 64, 16, 1),
    "test": (2, 64, 32, 16, 1),
}[S.profile_name]
MLP_RATIO = 4  # hidden width of the MLP over the model width
ROPE_BASE = 10000.0  # rotary embedding base frequency
LOGIT_SOFTCAP = 15.0  # tanh cap on the output logits, for stability
FUSED_LOSS = GPU  # the loss and its gradient in one pass over the logits, in slices of tokens
LOSS_CHUNKS = 4  # token slices of the fused loss
# training steps: the forward products of normed inputs (q, k, v, MLP up, the head's logits) in float8 e4m3, where the GPU has it
FP8 = GPU and S.device.type == "cuda" and torch.cuda.get_device_capability(S.device) >= (8, 9)
VALUE_EMBEDS = GPU  # every other block (the last among them) adds a token embedding of its own to its values
VE_GATE_CHANNELS = 32  # input channels the value embedding's per-head gate reads
X0_SKIP = GPU  # each block's input mixes the residual stream with the embedding, by two learned gains
MATRIX_LR = 0.04 if GPU else 0.02  # Muon learning rate for the transformer's weight matrices
EMBED_LR = 0.6 if GPU else 0.3  # AdamW learning rate for the token (and value) embeddings
HEAD_LR = 0.004  # AdamW learning rate for the output head
GAIN_LR = 0.5  # AdamW learning rate for the x0 gains (the residual gains take a hundredth of it)
ADAM_BETAS = (0.8, 0.95)  # AdamW betas
MUON_MOMENTUM = 0.95  # Muon momentum (Nesterov) ...
MUON_MOMENTUM_START = 0.85 if GPU else 0.95  # ... reached from this over the first MOMENTUM_WARMUP steps
MOMENTUM_WARMUP = 300  # optimizer steps
NORMUON_BETA2 = 0.95 if GPU else None  # NorMuon: per-neuron second-moment normalisation of Muon's update
WEIGHT_DECAY = 0.2 if GPU else 0.0  # cautious weight decay on the matrices, falling linearly to zero
NS_COEFFS = [  # Newton-Schulz (a, b, c) per iteration: Polar Express's (Amsel et al., 2025) ...
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
] if GPU else [(3.4445, -4.7750, 2.0315)] * 5  # ... or five times the quintic of Muon's first version
NS_MARGIN = 1.02 if GPU else 1.0  # the input is divided by this times its norm, to stay inside the unit ball
WARMDOWN = 0.5 if GPU else 0.4  # share of the budget (in tokens) at the end over which the learning rate falls to zero
SKIP_WARMUP_STEPS = GPU  # no optimizer step on the harness's warm-up batches (random tokens): they only compile
COMPILE = S.device.type == "cuda"  # torch.compile the model (pays off on a GPU)
LOG_EVERY = 50  # steps between train-loss lines in the log

# ---------------------------------------------------------------------------------------------
# Model


def rms_norm(x):
    return F.rms_norm(x, (x.size(-1),))


def normed_linear(x, weight, fp8):
    """x @ weight.T for an rms-normed x; its forward product in float8 if `fp8` (a training step)."""
    return Fp8NormedLinear.apply(x, weight) if fp8 else F.linear(x, weight)


TENSORWISE = F.ScalingType(0) if FP8 else None  # ScalingType.TensorWise: one scale for a whole tensor


def fp8_operands(x, weight):
    """x (rms-normed: no entry over sqrt(width)) by a fixed scale, so that its cast fuses into the
    norm's kernel, and weight by its largest entry, cast to float8 e4m3 (448 at most), with the scales."""
    x_scale = torch.full((), x.size(-1) ** 0.5 / 448, device=x.device)
    w_scale = weight.abs().amax().clamp_min(1e-30) / 448
    return (x.float() / x_scale).to(torch.float8_e4m3fn), (weight / w_scale).to(torch.float8_e4m3fn), x_scale, w_scale


@torch.compiler.allow_in_graph  # torch 2.11 cannot trace into scaled_mm: it enters the compiled graph whole
def fp8_matmul(a, b, scale_a, scale_b):
    return F.scaled_mm(a, b, scale_a, TENSORWISE, scale_b, TENSORWISE, output_dtype=torch.bfloat16, use_fast_accum=True)


class Fp8NormedLinear(torch.autograd.Function):
    """x @ weight.T for an rms-normed x, the forward product in float8 (`fp8_operands`). The
    backward pass is bf16, as without it: float8 gradients, and float8 for
    the unbounded inputs of the MLP's down and the attention's output products, need a scale taken
    from the whole tensor, passes that cost about what the faster products save (docs/trainer.md).
    """

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        xq, wq, x_scale, w_scale = fp8_operands(x.flatten(0, -2), weight)
        return fp8_matmul(xq, wq.T, x_scale, w_scale).unflatten(0, x.shape[:-1])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_w = grad.flatten(0, -2).T @ x.flatten(0, -2)
        return grad @ weight.to(grad.dtype), grad_w.float()


def rotary_tables(seq_len, head_dim, device):
    inv_freq = ROPE_BASE ** -(torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    return angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]


def apply_rotary(x, cos, sin):
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, value_embed):
        super().__init__()
        self.heads = MODEL_DIM // HEAD_DIM
        self.q = nn.Linear(MODEL_DIM, MODEL_DIM, bias=False)
        self.k = nn.Linear(MODEL_DIM, MODEL_DIM, bias=False)
        self.v = nn.Linear(MODEL_DIM, MODEL_DIM, bias=False)
        self.out = nn.Linear(MODEL_DIM, MODEL_DIM, bias=False)
        # how much of the value embedding each head adds to its values: 2 sigmoid(gate), 1 at init
        self.ve_gate = nn.Linear(VE_GATE_CHANNELS, self.heads, bias=False) if value_embed else None

    def forward(self, x, cos, sin, ve=None, fp8=False):
        B, T, C = x.shape
        q, k, v = (normed_linear(x, p.weight, fp8).view(B, T, self.heads, HEAD_DIM) for p in (self.q, self.k, self.v))
        if ve is not None:
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., :VE_GATE_CHANNELS]))
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.heads, HEAD_DIM).type_as(v)
        q, k = apply_rotary(rms_norm(q), cos, sin), apply_rotary(rms_norm(k), cos, sin)  # QK-norm, then RoPE
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(MODEL_DIM, MLP_RATIO * MODEL_DIM, bias=False)
        self.down = nn.Linear(MLP_RATIO * MODEL_DIM, MODEL_DIM, bias=False)

    def forward(self, x, fp8=False):
        return self.down(F.relu(normed_linear(x, self.up.weight, fp8)).square())  # ReLU squared


class Block(nn.Module):
    def __init__(self, value_embed=False):
        super().__init__()
        self.attn = Attention(value_embed)
        self.mlp = MLP()
        if X0_SKIP:  # x <- resid_gain * x + x0_gain * x0, in the block so that it compiles with it
            self.resid_gain = nn.Parameter(torch.ones(()))
            self.x0_gain = nn.Parameter(torch.zeros(()))

    def forward(self, x, cos, sin, x0=None, ve=None, fp8=False):  # fp8: a training step
        if x0 is not None:
            x = self.resid_gain * x + self.x0_gain * x0
        x = x + self.attn(rms_norm(x), cos, sin, ve, fp8)
        return x + self.mlp(rms_norm(x), fp8)


class LMHead(nn.Module):
    """The output layer (untied from the embedding): soft-capped logits, or the loss given targets."""

    def __init__(self, vocab_size):
        super().__init__()
        self.proj = nn.Linear(MODEL_DIM, vocab_size, bias=False)

    def forward(self, x, targets=None, fp8=False):
        if FUSED_LOSS and targets is not None:
            return SoftcapCrossEntropy.apply(rms_norm(x), self.proj.weight, targets, fp8)
        logits = self.proj(rms_norm(x)).float()
        logits = LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class SoftcapCrossEntropy(torch.autograd.Function):
    """The head's training loss: mean cross-entropy of the soft-capped logits of x @ weight.T.

    The gradient is worked out in the forward pass, LOSS_CHUNKS slices of tokens at a time, each
    slice's loss and gradient in one fused kernel, so the float32 logits never exist whole; the
    backward pass only scales the stored gradients (measured: docs/trainer.md). With `fp8` the
    logits' product is float8 (x is rms-normed, as Fp8NormedLinear's), the gradient's bf16.
    """

    @staticmethod
    def forward(ctx, x, weight, targets, fp8=False):
        ctx.shape = x.shape[:2]
        x, w, targets = x.flatten(0, 1), weight.to(torch.bfloat16), targets.flatten()
        xb, n = x.to(torch.bfloat16), targets.numel()
        loss, grad_x, grad_w = 0.0, [], torch.zeros_like(weight)
        if fp8:
            xq, wq, x_scale, w_scale = fp8_operands(x, weight)
            xq = xq.chunk(LOSS_CHUNKS)
        for i, (xs, ts) in enumerate(zip(xb.chunk(LOSS_CHUNKS), targets.chunk(LOSS_CHUNKS))):  # noqa: B905
            logits = fp8_matmul(xq[i], wq.T, x_scale, w_scale) if fp8 else xs @ w.T
            # tanh(u) as 2 sigmoid(2u) - 1: one exp instead of tanh's longer sequence; the capped
            # logits are at most LOGIT_SOFTCAP, so their exp needs no max taken first (float32
            # holds 8192 of them up to a cap of about 80)
            capped = 2 * torch.sigmoid(logits.float() * (2 / LOGIT_SOFTCAP)) - 1
            exp = torch.exp(LOGIT_SOFTCAP * capped)
            total = exp.sum(dim=-1, keepdim=True)
            picked = LOGIT_SOFTCAP * capped.gather(1, ts[:, None])
            loss = loss + (total.log() - picked).sum()
            hit = torch.arange(exp.size(1), device=ts.device)[None] == ts[:, None]
            grad = ((exp / total - hit.float()) * (1 - capped.square()) / n).to(torch.bfloat16)
            grad_x.append(grad @ w)
            grad_w += (grad.T @ xs).float()
        ctx.save_for_backward(torch.cat(grad_x).to(x.dtype), grad_w)
        return loss / n

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w = ctx.saved_tensors
        return (grad_x * grad_loss).unflatten(0, ctx.shape), grad_w * grad_loss, None, None


def has_value_embed(layer):
    return VALUE_EMBEDS and layer % 2 == (DEPTH - 1) % 2


class GPT(nn.Module):
    def __init__(self, vocab_size, seq_len):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, MODEL_DIM)
        self.blocks = nn.ModuleList(Block(has_value_embed(i)) for i in range(DEPTH))
        self.value_embeds = nn.ModuleList(nn.Embedding(vocab_size, MODEL_DIM) for i in range(DEPTH) if has_value_embed(i))
        self.head = LMHead(vocab_size)
        cos, sin = rotary_tables(seq_len, HEAD_DIM, self.embed.weight.device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self):
        bound = (3 / MODEL_DIM) ** 0.5
        nn.init.normal_(self.embed.weight, std=1.0)
        nn.init.normal_(self.head.proj.weight, std=0.001)
        for block in self.blocks:
            for linear in (block.attn.q, block.attn.k, block.attn.v, block.mlp.up):
                nn.init.uniform_(linear.weight, -bound, bound)
            nn.init.zeros_(block.attn.out.weight)  # each block starts as the identity
            nn.init.zeros_(block.mlp.down.weight)
            if block.attn.ve_gate is not None:
                nn.init.zeros_(block.attn.ve_gate.weight)
            if X0_SKIP:
                block.resid_gain.fill_(1.0)
                block.x0_gain.fill_(0.1)
        for table in self.value_embeds:
            nn.init.uniform_(table.weight, -bound, bound)

    def forward(self, idx, targets=None):
        T = idx.size(1)
        x = x0 = rms_norm(self.embed(idx))
        if torch.is_autocast_enabled(x.device.type):  # training on a GPU: half the residual stream's memory traffic
            x = x0 = x.bfloat16()
        tables = iter(self.value_embeds)
        for i, block in enumerate(self.blocks):
            ve = next(tables)(idx) if has_value_embed(i) else None
            x = block(x, self.cos[:, :T], self.sin[:, :T], x0 if X0_SKIP else None, ve, FP8 and targets is not None)
        return self.head(x, targets, FP8 and targets is not None)


# ---------------------------------------------------------------------------------------------
# Optimizer: Muon for the weight matrices, AdamW for the embeddings, the head and the gains


@torch.no_grad()
def orthogonalize(G, steps=5):
    """Approximately replace G by the nearest semi-orthogonal matrix (Newton-Schulz iteration)."""
    X = G.to(torch.bfloat16 if G.is_cuda else torch.float32)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * NS_MARGIN + 1e-7)
    for a, b, c in NS_COEFFS[:steps]:
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return (X.mT if tall else X).to(G.dtype)


class Muon(torch.optim.Optimizer):
    """Momentum, then orthogonalized updates; matrices of one shape are done in one batch.

    With `beta2` (NorMuon) each row of a tall update (column of a wide one) is divided by the root
    of its running mean square, and the update is rescaled to its former norm. `weight_decay` is
    cautious: it decays only the entries that the update moves towards zero as well.
    """

    def __init__(self, params, lr, momentum, beta2=None, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, beta2=beta2, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            by_shape = {}
            for p in group["params"]:
                by_shape.setdefault(p.shape, []).append(p)
            for shape, params in by_shape.items():
                grads = torch.stack([p.grad for p in params])
                state = self.state[params[0]]
                if "momentum" not in state:
                    state["momentum"] = torch.zeros_like(grads)
                buf = state["momentum"]
                buf.lerp_(grads, 1 - group["momentum"])
                update = orthogonalize(grads.lerp_(buf, group["momentum"]))
                if group["beta2"] is not None:
                    update = self.normalize(update, state, group["beta2"])
                if group["weight_decay"]:
                    weights = torch.stack(params)
                    update += group["weight_decay"] * weights * (update * weights >= 0)
                lr = group["lr"] * max(1.0, shape[0] / shape[1]) ** 0.5
                torch._foreach_add_(params, list(update.unbind(0)), alpha=-lr)

    @staticmethod
    def normalize(update, state, beta2):
        tall = update.size(-2) >= update.size(-1)
        mean_square = update.square().mean(dim=-1 if tall else -2, keepdim=True)
        if "second_moment" not in state:
            state["second_moment"] = torch.zeros_like(mean_square)
        state["second_moment"].lerp_(mean_square, 1 - beta2)
        scaled = update * state["second_moment"].clamp_min(1e-10).rsqrt()
        return scaled * (update.norm(dim=(-2, -1), keepdim=True) / scaled.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))


# ---------------------------------------------------------------------------------------------
# Training

model = GPT(S.vocab_size, S.seq_len).to(S.device)
model.init_weights()
matrices = [p for block in model.blocks for p in block.parameters() if p.ndim == 2]
muon = Muon(matrices, lr=MATRIX_LR, momentum=MUON_MOMENTUM, beta2=NORMUON_BETA2, weight_decay=WEIGHT_DECAY)
width_scale = (MODEL_DIM / 768) ** -0.5  # AdamW rates were tuned at width 768
adam_groups = [dict(params=model.embed.parameters(), lr=EMBED_LR * width_scale),
               dict(params=model.head.parameters(), lr=HEAD_LR * width_scale)]
if VALUE_EMBEDS:
    adam_groups.append(dict(params=model.value_embeds.parameters(), lr=EMBED_LR * width_scale))
if X0_SKIP:
    adam_groups += [dict(params=[b.resid_gain for b in model.blocks], lr=GAIN_LR * 0.01),
                    dict(params=[b.x0_gain for b in model.blocks], lr=GAIN_LR, betas=(0.96, 0.95))]
adam = torch.optim.AdamW(adam_groups, betas=ADAM_BETAS, eps=1e-10, weight_decay=0.0, fused=S.device.type == "cuda")
optimizers = [muon, adam]
for opt in optimizers:
    for group in opt.param_groups:
        group["initial_lr"] = group["lr"]
if COMPILE:  # one graph: 3% more tokens a second than compiling each block apart, at 4 blocks (docs/trainer.md)
    model.compile(dynamic=False, fullgraph=True)


def lr_scale(progress):
    return 1.0 if progress < 1 - WARMDOWN else max(0.0, (1 - progress) / WARMDOWN)


def muon_momentum(step):
    return MUON_MOMENTUM - (MUON_MOMENTUM - MUON_MOMENTUM_START) * max(0.0, 1 - step / MOMENTUM_WARMUP)


step = 0
for micro, (x, y) in enumerate(S.batches(DEVICE_BATCH)):
    with torch.autocast(S.device.type, dtype=torch.bfloat16, enabled=S.device.type == "cuda"):
        loss = model(x, y)
    (loss / GRAD_ACCUM).backward()
    if (micro + 1) % GRAD_ACCUM:
        continue
    progress = S.progress()
    if SKIP_WARMUP_STEPS and progress == 0:  # a warm-up batch: compiled and run, never learnt from
        model.zero_grad(set_to_none=True)
        continue
    scale = lr_scale(progress)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * scale
    for group in muon.param_groups:
        group["momentum"] = muon_momentum(step)
        group["weight_decay"] = WEIGHT_DECAY * (1 - progress)
    for opt in optimizers:
        opt.step()
    model.zero_grad(set_to_none=True)
    step += 1
    if step % LOG_EVERY == 0:
        print(f"step {step:6d} | loss {loss.item():.4f} | lr x{scale:.2f} | {progress:.0%} of budget", flush=True)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"training loss is {loss.item()} at step {step}")

S.finish(model)
