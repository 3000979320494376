"""The baseline training script: a small modern GPT, trained on a fixed budget of tokens.

This is the file the research agents edit. It gets its data, its clock and its score from the
harness (`session()`): it trains on `S.batches(...)` until they stop, then hands the model to
`S.finish(model)`, which computes val_bpb. It never reads data files or reports its own score.
Its schedule follows `S.progress()`, the share of the budget's tokens served, so a run of one
seed gives the same model on any machine of the profile's device class, however busy.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from node.trainer.harness import session

S = session()

# ---------------------------------------------------------------------------------------------
# Hyperparameters

# Model size and batch per profile: (depth, width, head dim, sequences per micro-batch, micro-batches per step)
DEPTH, MODEL_DIM, HEAD_DIM, DEVICE_BATCH, GRAD_ACCUM = {
    "gpu": (8, 512, 128, 128, 2),
    "cpu": (4, 128, 64, 16, 1),
    "test": (2, 64, 32, 16, 1),
}[S.profile_name]
MLP_RATIO = 4  # hidden width of the MLP over the model width
ROPE_BASE = 10000.0  # rotary embedding base frequency
LOGIT_SOFTCAP = 15.0  # tanh cap on the output logits, for stability
MATRIX_LR = 0.02  # Muon learning rate for the transformer's weight matrices
EMBED_LR = 0.3  # AdamW learning rate for the token embedding
HEAD_LR = 0.004  # AdamW learning rate for the output head
ADAM_BETAS = (0.8, 0.95)  # AdamW betas
MUON_MOMENTUM = 0.95  # Muon momentum (Nesterov)
WARMDOWN = 0.4  # share of the budget (in tokens) at the end over which the learning rate falls to zero
COMPILE = S.device.type == "cuda"  # torch.compile the blocks and the head (pays off on a GPU)
LOG_EVERY = 50  # steps between train-loss lines in the log

# ---------------------------------------------------------------------------------------------
# Model


def rms_norm(x):
    return F.rms_norm(x, (x.size(-1),))


def rotary_tables(seq_len, head_dim, device):
    inv_freq = ROPE_BASE ** -(torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    return angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]


def apply_rotary(x, cos, sin):
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = MODEL_DIM // HEAD_DIM
        self.q = nn.Linear(MODEL_DIM, MODEL_DIM, bias=False)
        self.k = nn.Linear(MODEL_DIM, MODEL_DIM, bias=False)
        self.v = nn.Linear(MODEL_DIM, MODEL_DIM, bias=False)
        self.out = nn.Linear(MODEL_DIM, MODEL_DIM, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = (proj(x).view(B, T, self.heads, HEAD_DIM) for proj in (self.q, self.k, self.v))
        q, k = apply_rotary(rms_norm(q), cos, sin), apply_rotary(rms_norm(k), cos, sin)  # QK-norm, then RoPE
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(MODEL_DIM, MLP_RATIO * MODEL_DIM, bias=False)
        self.down = nn.Linear(MLP_RATIO * MODEL_DIM, MODEL_DIM, bias=False)

    def forward(self, x):
        return self.down(F.relu(self.up(x)).square())  # ReLU squared


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.mlp = MLP()

    def forward(self, x, cos, sin):
        x = x + self.attn(rms_norm(x), cos, sin)
        return x + self.mlp(rms_norm(x))


class LMHead(nn.Module):
    """The output layer (untied from the embedding): soft-capped logits, or the loss given targets."""

    def __init__(self, vocab_size):
        super().__init__()
        self.proj = nn.Linear(MODEL_DIM, vocab_size, bias=False)

    def forward(self, x, targets=None):
        logits = self.proj(rms_norm(x)).float()
        logits = LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class GPT(nn.Module):
    def __init__(self, vocab_size, seq_len):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, MODEL_DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = LMHead(vocab_size)
        cos, sin = rotary_tables(seq_len, HEAD_DIM, self.embed.weight.device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self):
        nn.init.normal_(self.embed.weight, std=1.0)
        nn.init.normal_(self.head.proj.weight, std=0.001)
        for block in self.blocks:
            for linear in (block.attn.q, block.attn.k, block.attn.v, block.mlp.up):
                nn.init.uniform_(linear.weight, -(3 / MODEL_DIM) ** 0.5, (3 / MODEL_DIM) ** 0.5)
            nn.init.zeros_(block.attn.out.weight)  # each block starts as the identity
            nn.init.zeros_(block.mlp.down.weight)

    def forward(self, idx, targets=None):
        T = idx.size(1)
        x = rms_norm(self.embed(idx))
        for block in self.blocks:
            x = block(x, self.cos[:, :T], self.sin[:, :T])
        return self.head(x, targets)


# ---------------------------------------------------------------------------------------------
# Optimizer: Muon for the weight matrices, AdamW for the embedding and the head


@torch.no_grad()
def orthogonalize(G, steps=5):
    """Approximately replace G by the nearest semi-orthogonal matrix (Newton-Schulz iteration)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.to(torch.bfloat16 if G.is_cuda else torch.float32)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return (X.mT if tall else X).to(G.dtype)


class Muon(torch.optim.Optimizer):
    """Momentum, then orthogonalized updates; matrices of one shape are done in one batch."""

    def __init__(self, params, lr, momentum):
        super().__init__(params, dict(lr=lr, momentum=momentum))

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
                scale = max(1.0, shape[0] / shape[1]) ** 0.5
                torch._foreach_add_(params, list(update.unbind(0)), alpha=-group["lr"] * scale)


# ---------------------------------------------------------------------------------------------
# Training

model = GPT(S.vocab_size, S.seq_len).to(S.device)
model.init_weights()
matrices = [p for block in model.blocks for p in block.parameters()]
muon = Muon(matrices, lr=MATRIX_LR, momentum=MUON_MOMENTUM)
width_scale = (MODEL_DIM / 768) ** -0.5  # AdamW rates were tuned at width 768
adam = torch.optim.AdamW(
    [dict(params=model.embed.parameters(), lr=EMBED_LR * width_scale),
     dict(params=model.head.parameters(), lr=HEAD_LR * width_scale)],
    betas=ADAM_BETAS, eps=1e-10, weight_decay=0.0, fused=S.device.type == "cuda",
)
optimizers = [muon, adam]
for opt in optimizers:
    for group in opt.param_groups:
        group["initial_lr"] = group["lr"]
if COMPILE:  # by region: the blocks share one compiled graph, so new shapes compile one block, not DEPTH
    for module in (*model.blocks, model.head):
        module.compile(dynamic=False)


def lr_scale(progress):
    return 1.0 if progress < 1 - WARMDOWN else max(0.0, (1 - progress) / WARMDOWN)


for micro, (x, y) in enumerate(S.batches(DEVICE_BATCH)):
    with torch.autocast(S.device.type, dtype=torch.bfloat16, enabled=S.device.type == "cuda"):
        loss = model(x, y)
    (loss / GRAD_ACCUM).backward()
    if (micro + 1) % GRAD_ACCUM:
        continue
    scale = lr_scale(S.progress())
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * scale
        opt.step()
    model.zero_grad(set_to_none=True)
    step = (micro + 1) // GRAD_ACCUM
    if step % LOG_EVERY == 0:
        print(f"step {step:6d} | loss {loss.item():.4f} | lr x{scale:.2f} | {S.progress():.0%} of budget", flush=True)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"training loss is {loss.item()} at step {step}")

S.finish(model)
