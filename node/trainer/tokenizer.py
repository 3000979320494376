"""The BPE tokenizer: trained locally with rustbpe, encoded with tiktoken, pinned by its hash.

The saved file is tiktoken's plain format (base64 token, rank) plus a small JSON header, so
the same training text gives byte-identical files, and so the same hash, on every machine.
Part of the harness: nothing here may be imported by `train.py`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tiktoken

from node.trainer.errors import TrainerError

# GPT-4's split pattern with digits grouped by at most two, which suits small vocabularies.
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)
BOS = "<|bos|>"  # starts every document; the only special token


@dataclass(frozen=True)
class Tokenizer:
    """A trained tokenizer: tiktoken for speed, raw token bytes for honest bits-per-byte."""

    encoding: tiktoken.Encoding
    sha256: str
    bos_id: int

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode_documents(self, docs: list[str]) -> list[list[int]]:
        """Each document's tokens, with BOS in front, encoded on all cores."""
        batches = self.encoding.encode_ordinary_batch(docs, num_threads=os.cpu_count() or 1)
        return [[self.bos_id, *ids] for ids in batches]

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes each token id stands for, from its raw bytes; 0 for special tokens.

        Counting from raw bytes matters: a token holding half of a multi-byte character decodes
        to U+FFFD (3 bytes), which would inflate the byte count and flatter bits-per-byte.
        """
        sizes = np.zeros(self.vocab_size, dtype=np.int32)
        for i in range(self.vocab_size):
            if i != self.bos_id:
                sizes[i] = len(self.encoding.decode_single_token_bytes(i))
        return sizes


def train_tokenizer(texts: Iterable[str], vocab_size: int, path: Path) -> Tokenizer:
    """Train BPE on `texts` and save it to `path`; the result's hash pins it for a campaign."""
    import rustbpe

    if vocab_size < 257 or vocab_size > 65536:
        raise TrainerError(f"vocab size {vocab_size} is out of range; use 257 to 65536 (tokens are stored as uint16)")
    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(iter(texts), vocab_size - 1, pattern=SPLIT_PATTERN)
    ranks = {bytes(token): rank for token, rank in bpe.get_mergeable_ranks()}
    lines = [f"{base64.b64encode(token).decode()} {rank}" for token, rank in sorted(ranks.items(), key=lambda x: x[1])]
    header = {"pattern": bpe.get_pattern(), "special": {BOS: len(ranks)}, "vocab_size": len(ranks) + 1}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps(header, sort_keys=True) + "\n" + "\n".join(lines) + "\n")
    tmp.replace(path)
    return load_tokenizer(path)


def load_tokenizer(path: Path) -> Tokenizer:
    """Load a tokenizer file written by `train_tokenizer`."""
    try:
        raw = path.read_bytes()
        first, _, body = raw.partition(b"\n")
        header = json.loads(first)
        ranks = {}
        for line in body.splitlines():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    except (OSError, ValueError) as exc:
        raise TrainerError(f"tokenizer file {path} is unreadable ({exc}); delete it and run `swarm data build`") from exc
    encoding = tiktoken.Encoding(
        name=f"swarm-{len(ranks)}", pat_str=header["pattern"], mergeable_ranks=ranks, special_tokens=header["special"]
    )
    return Tokenizer(encoding, hashlib.sha256(raw).hexdigest(), header["special"][BOS])
