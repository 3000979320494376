"""The scorer's check that a model predicts each token from the tokens before it in its own row.

A prediction may depend on the earlier tokens of its row and on nothing else: not on a later
token of the row, at any position, and not on another row of the batch. The check recomputes
predictions in inputs where only what a prediction may not depend on changed, and compares them
with the predictions the scorer scored, so a model cannot pass by behaving well only when
checked. It runs inside the scorer; nothing in here may run or import `train.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

# Largest change of a scored log-probability (nats) that a change the prediction may not depend
# on may cause. Honest models move by 0 on the CPU (same shapes give the same arithmetic); a
# cheat that stays below this everywhere gains at most this many nats a token: about 0.0004 bpb.
TOLERANCE = 1e-3

Model = Callable[[torch.Tensor], torch.Tensor]


class LookAheadError(RuntimeError):
    """The model's predictions depend on later tokens of their row or on other rows."""


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def moved(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-position largest change between two log-probability tensors (..., T, V); a NaN in
    one and not the other, or an infinity that moved, counts as infinitely far."""
    same = (a == b) | ((a - b).abs() <= TOLERANCE)
    gap = torch.where(same, torch.zeros_like(a), (a - b).abs().nan_to_num(float("inf")))
    return gap.amax(dim=-1)


def splice(row: np.ndarray, cut: int, donor: np.ndarray, vocab: int) -> np.ndarray:
    """`row` up to and including position `cut`, then `donor`'s tokens: real text after the cut,
    and never the row's own next token at `cut + 1`."""
    out = np.concatenate([row[: cut + 1], donor[cut + 1 :]])
    if cut + 1 < len(row) and out[cut + 1] == row[cut + 1]:
        out[cut + 1] = (row[cut + 1] + 1) % vocab
    return out


class Checker:
    """Checks one scoring pass, batch by batch, against the predictions the scorer scored.

    - Every scored row: one variant with the tokens after a random cut replaced by another
      row's, all rows of a batch at once (so every other row of the batch changed too); the
      predictions up to each cut must not move. This covers all rows, a random position each.
    - `exhaustive` rows, drawn at random from the scored ones: one variant for every position
      of the row, so that no position is left out.
    A failing row is checked again with only its own later tokens changed, then with only the
    other rows changed, to say which of the two its predictions depend on.

    `rows` are all scored rows (rows x seq_len token ids); `rng` is the scorer's own, seeded
    from the operating system: the model cannot know which rows or cuts are checked.
    """

    def __init__(
        self,
        model: Model,
        rows: np.ndarray,
        batch_size: int,
        vocab: int,
        device: torch.device,
        rng: np.random.Generator,
        exhaustive: int,
    ) -> None:
        self.model, self.rows, self.batch_size = model, rows, batch_size
        self.vocab, self.device, self.rng = vocab, device, rng
        count, self.seq_len = rows.shape
        self.exhaustive = set(
            rng.choice(count, size=min(exhaustive, count), replace=False).tolist()
        )
        self.checked_tokens = 0
        self.seconds = 0.0  # spent checking, on the scorer's clock

    def _run(self, batch: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.int64)).to(self.device)
        self.checked_tokens += x.numel()
        return log_probs(self.model(x))

    def _donor(self, avoid: int) -> np.ndarray:
        pick = int(self.rng.integers(len(self.rows) - 1)) if len(self.rows) > 1 else 0
        return self.rows[pick + (pick >= avoid and len(self.rows) > 1)]

    def check_batch(self, first: int, x: np.ndarray, scored: torch.Tensor) -> None:
        """`x` is the scored batch (padded to batch_size), its rows `first`.. of `rows`;
        `scored` the model's logits for it, as scored."""
        began = time.perf_counter()
        try:
            self._check_batch(first, x, scored)
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.seconds += time.perf_counter() - began

    def _check_batch(self, first: int, x: np.ndarray, scored: torch.Tensor) -> None:
        reference = log_probs(scored)
        count = min(len(x), len(self.rows) - first)
        cuts = self.rng.integers(0, self.seq_len, size=len(x))  # the last: other rows changed only
        variant = np.stack(
            [splice(x[i], int(cuts[i]), self._donor(first + i), self.vocab) for i in range(len(x))]
        )
        got = self._run(variant)[:count]
        self._compare(x, np.arange(count), cuts[:count], got, reference[:count], first)
        for i in range(count):
            if first + i in self.exhaustive:
                self._every_position(x, i, reference[i], first + i)

    def _every_position(self, x: np.ndarray, i: int, reference: torch.Tensor, row: int) -> None:
        """One variant of the row for every cut, batch after batch. Each is compared with the row
        as predicted at the same slot of a batch of copies of it (a GPU's kernels may round a
        row differently at another slot), and the copy at the row's own slot with the scored
        prediction itself."""
        copies = self._run(np.repeat(x[i : i + 1], self.batch_size, 0))
        self._compare(x, np.array([i]), np.array([self.seq_len - 1]), copies[i : i + 1],
                      reference[None], row - i)  # fmt: skip
        donor = self._donor(row)
        cuts = np.arange(self.seq_len)
        for start in range(0, len(cuts), self.batch_size):
            part = cuts[start : start + self.batch_size]
            batch = np.stack([splice(x[i], int(c), donor, self.vocab) for c in part])
            if len(batch) < self.batch_size:  # the model's input shape is fixed
                pad = np.repeat(x[i : i + 1], self.batch_size - len(batch), 0)
                batch = np.concatenate([batch, pad])
            got = self._run(batch)[: len(part)]
            self._compare(x, np.full(len(part), i), part, got, copies[: len(part)], row - i,
                          own=reference)  # fmt: skip

    def _compare(
        self, x: np.ndarray, slots: np.ndarray, cuts: np.ndarray, got: torch.Tensor,
        reference: torch.Tensor, first: int, own: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        """Checked predictions `got[j]` up to position `cuts[j]` against `reference[j]`;
        explains the first that moved, against `own` (the scored prediction of that row) when
        given, else against `reference[j]`. Row `slots[j]` of the batch `x` is row
        `first + slots[j]` of the scored rows."""
        cut = torch.as_tensor(cuts, device=got.device)
        upto = torch.arange(self.seq_len, device=got.device)[None, :] <= cut[:, None]
        bad = ((moved(got, reference) > 0) & upto).any(dim=1)
        if bool(bad.any()):
            j = int(torch.nonzero(bad)[0])
            i = int(slots[j])
            gap = moved(got[j], reference[j])[: int(cuts[j]) + 1]
            scored = reference[j] if own is None else own
            self._explain(x, i, int(cuts[j]), scored, first + i, gap)

    def _explain(
        self, x: np.ndarray, i: int, cut: int, reference: torch.Tensor, row: int,
        seen: torch.Tensor,
    ) -> None:  # fmt: skip
        """Raise LookAheadError saying what the failing prediction depends on: its own later
        tokens, the other rows of its batch, or (when neither alone moves it) both."""
        own = x.copy()
        own[i] = splice(x[i], cut, self._donor(row), self.vocab)
        gap = moved(self._run(own)[i], reference)[: cut + 1]
        if bool((gap > 0).any()):
            at = int(torch.nonzero(gap > 0)[0])
            raise LookAheadError(
                f"the model looks ahead: its prediction at position {at} of a validation row "
                f"changed by {float(gap[at]):.3g} nats when only tokens after position {cut} "
                "changed; a language model may use earlier tokens of its row only"
            )
        # every other row changed at every position (a donor's token that happens to equal the
        # row's own is moved), so that a prediction reading any token of another row moves
        donor = self._donor(row)
        others = np.where(donor[None, :] == x, (donor[None, :] + 1) % self.vocab, donor[None, :])
        others[i] = x[i]
        gap = moved(self._run(others)[i], reference)
        if bool((gap > 0).any()):
            at = int(torch.nonzero(gap > 0)[0])
            raise LookAheadError(
                f"the model reads across rows: its prediction at position {at} of a validation "
                f"row changed by {float(gap[at]):.3g} nats when only the other rows of its batch "
                "changed; each row must be predicted on its own"
            )
        at = int(torch.nonzero(seen > 0)[0])
        again = moved(self._run(x)[i], reference)
        if bool((again > 0).any()):
            raise LookAheadError(
                f"the model's predictions are not a function of its input: row {row} scored "
                f"twice gave log-probabilities {float(again.max()):.3g} nats apart"
            )
        raise LookAheadError(
            f"the model looks ahead: its prediction at position {at} of a validation row changed "
            f"by {float(seen[at]):.3g} nats when later tokens of the row and the other rows of its "
            "batch changed; a language model may use earlier tokens of its row only"
        )
