"""The look-ahead check on models built in this process: a cheat it refuses would have won, an
honest model is never refused, and a cheat is caught wherever it looks, whichever rows it picks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from node.trainer.causality import Checker, LookAheadError
from node.trainer.scorer import evaluate_bpb

VOCAB, SEQ, ROWS, BATCH = 64, 32, 24, 8


class Causal(torch.nn.Module):
    """A tiny honest model: each prediction from a running mean of the embeddings so far."""

    def __init__(self, peek=None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.out = torch.nn.Linear(16, VOCAB)
        self.peek = peek

    def forward(self, idx):
        h = self.embed(idx).cumsum(1) / torch.arange(1, idx.size(1) + 1)[None, :, None]
        logits = self.out(h)
        return logits if self.peek is None else logits + self.peek(idx)


def nxt(idx):
    return 6 * F.one_hot(idx.roll(-1, 1), VOCAB).float()


def positions(idx):
    return torch.arange(idx.size(1))[None, :, None]


PEEKS = {
    "every position": nxt,
    "one position in the row": lambda idx: nxt(idx) * (positions(idx) == SEQ - 5),
    "rows whose first token is even": lambda idx: nxt(idx) * (idx[:, :1, None] % 2 == 0),
    "the last position of the next row's first token": lambda idx: (
        6 * F.one_hot(idx.roll(-1, 0)[:, :1], VOCAB).float() * (positions(idx) == SEQ - 1)
    ),
}


def text() -> np.ndarray:
    """Tokens with structure (a noisy repeating pattern) so that a peek pays off."""
    rng = np.random.default_rng(1)
    base = np.tile(np.arange(VOCAB), ROWS * SEQ // VOCAB + 2)
    noise = rng.integers(0, VOCAB, size=base.shape)
    return np.where(rng.random(base.shape) < 0.5, base, noise).astype(np.uint16)[: ROWS * SEQ + 1]


def score(model, check: bool, seed: int = 0, tokens: np.ndarray | None = None) -> dict:
    tokens = text() if tokens is None else tokens
    token_bytes = np.ones(VOCAB, dtype=np.int32)
    checker = None
    if check:
        rows = tokens[: ROWS * SEQ].reshape(ROWS, SEQ)
        checker = Checker(model, rows, BATCH, VOCAB, torch.device("cpu"),
                          np.random.default_rng(seed), exhaustive=2)  # fmt: skip
    with torch.no_grad():
        return evaluate_bpb(
            model, tokens, token_bytes, SEQ, ROWS, BATCH, torch.device("cpu"), checker
        )


def test_an_honest_model_passes_every_check_and_its_score_is_unchanged():
    model = Causal().eval()
    for seed in range(5):
        assert score(model, True, seed)["val_bpb"] == score(model, False)["val_bpb"]


@pytest.mark.parametrize("where", sorted(PEEKS))
def test_a_peek_would_win_and_is_refused(where):
    honest = score(Causal().eval(), False)["val_bpb"]
    cheat = Causal(PEEKS[where]).eval()
    assert score(cheat, False)["val_bpb"] < honest  # it pays, unchecked
    with pytest.raises(LookAheadError):
        score(cheat, True)


def test_a_peek_on_one_row_is_caught_when_that_row_is_checked_at_every_position():
    """A cheat on one scored row at one position is found by the exhaustive rows when they
    include it: the check leaves no position of a checked row out."""
    caught = 0
    for seed in range(40):
        only = lambda idx: nxt(idx) * (positions(idx) == 7) * (idx[:, :1, None] == text()[5 * SEQ])  # noqa: E731
        try:
            score(Causal(only).eval(), True, seed)
        except LookAheadError:
            caught += 1
    # 2 of 24 rows are checked at every position, and every row at one random position.
    assert 40 * 2 / 24 * 0.5 < caught < 40


def test_the_refusal_says_whether_the_model_looked_ahead_or_across_rows():
    with pytest.raises(LookAheadError, match="looks ahead"):
        score(Causal(nxt).eval(), True)
    with pytest.raises(LookAheadError, match="reads across rows"):
        score(Causal(lambda idx: F.one_hot(idx.roll(1, 0), VOCAB).float()).eval(), True)


def test_a_model_reading_another_row_is_named_so_when_rows_share_tokens():
    """The rows start with one of two tokens, so another row drawn to replace them often starts
    with the same one: every other row is still changed at every position, and a model that
    reads the next row's first token is refused for reading across rows, whatever rows and
    cuts are drawn."""
    tokens = text()
    tokens[: ROWS * SEQ : SEQ] = np.arange(ROWS) % 2
    across = Causal(lambda idx: 6 * F.one_hot(idx.roll(-1, 0)[:, :1], VOCAB).float()).eval()
    for seed in range(10):
        with pytest.raises(LookAheadError, match="reads across rows"):
            score(across, True, seed, tokens)
