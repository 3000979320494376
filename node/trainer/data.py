"""Token shards for a profile: corpus, tokenizer and pretokenized train/validation files.

`prepare_data` builds once and caches under a folder named by what went into it, so the same
inputs give the same tokenizer hash and the same shards on every machine. Part of the harness.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from node.trainer import corpus, webdata
from node.trainer.errors import TrainerError
from node.trainer.profiles import Profile
from node.trainer.tokenizer import Tokenizer, load_tokenizer, train_tokenizer

ENCODE_BATCH = 1024  # documents per tiktoken batch
HEARTBEAT_SECONDS = 10.0  # a step that prints nothing for longer than this says it is still going
Progress = Callable[[str], None]
BUILD_LOCK = ".build.lock"  # in the data cache: one process builds at a time


@dataclass(frozen=True)
class TokenData:
    """What a run reads: uint16 token files, the token byte table, and their hashes."""

    root: Path
    manifest: dict

    @property
    def train_path(self) -> Path:
        return self.root / "train.bin"

    @property
    def val_path(self) -> Path:
        return self.root / "val.bin"

    @property
    def token_bytes_path(self) -> Path:
        return self.root / "token_bytes.npy"

    @property
    def tokenizer_path(self) -> Path:
        return self.root / "tokenizer.tiktoken"

    @property
    def sha256(self) -> str:
        return self.manifest["sha256"]

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.tokenizer_path)


def _documents(profile: Profile, cache: Path, progress: Progress) -> tuple[Callable[[str], Iterator[str]], str]:
    """A function from split name to documents, and the hash of the text it reads."""
    kind, _, name = profile.data.partition(":")
    if kind == "embedded":
        with _heartbeat(progress, lambda s: f"corpus {name}: still building, {s:.0f} s"):  # slow fetches
            built = corpus.build_corpus(name, cache, progress)
        return built.documents, built.sha256
    if kind == "web":
        if name not in webdata.WEB_CORPORA:
            raise TrainerError(f"unknown web corpus {name!r}; choose one of {', '.join(webdata.WEB_CORPORA)} or use urls:PATH")
        shards = [webdata.Shard(url) for url in webdata.WEB_CORPORA[name]]
    else:
        shards = webdata.read_url_list(Path(name))
    folder = cache / "web"
    paths = [webdata.download(s, folder, progress) for s in shards]
    text_hash = hashlib.sha256("\n".join(s.url + " " + s.sha256 for s in shards).encode()).hexdigest()

    def documents(split: str) -> Iterator[str]:
        for path in (paths[-1:] if split == "val" else paths[:-1]):
            yield from webdata.documents(path)

    return documents, text_hash


def _tokenizer_text(docs: Iterator[str], limit: int, read: list[int]) -> Iterator[str]:
    """The first `limit` characters of `docs`; `read[0]` counts those handed out so far."""
    for doc in docs:
        if read[0] >= limit:
            return
        yield doc[: limit - read[0]]
        read[0] += min(len(doc), limit - read[0])


@contextmanager
def _heartbeat(progress: Progress, say: Callable[[float], str]) -> Iterator[None]:
    """While the block runs, `progress(say(seconds so far))` every HEARTBEAT_SECONDS: the
    tokenizer trains in one call that prints nothing, for a minute or more on the gpu profile."""
    done, start = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(HEARTBEAT_SECONDS):
            progress(say(time.monotonic() - start))

    thread = threading.Thread(target=beat, name="data-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _write_tokens(tokenizer: Tokenizer, docs: Iterator[str], path: Path, progress: Progress, label: str) -> int:
    count, shown = 0, time.monotonic()
    with path.open("wb") as out:
        while batch := list(itertools.islice(docs, ENCODE_BATCH)):
            for ids in tokenizer.encode_documents(batch):
                np.asarray(ids, dtype=np.uint16).tofile(out)
                count += len(ids)
            if time.monotonic() - shown > 2:
                progress(f"tokenizing {label}: {count / 1e6:.1f} M tokens")
                shown = time.monotonic()
    progress(f"tokenized {label}: {count / 1e6:.1f} M tokens")
    return count


@contextmanager
def _one_builder(cache: Path, progress: Progress) -> Iterator[None]:
    """Hold the cache's build lock: homes that share a cache (`SWARM_DATA`) build one at a time,
    and a second process finds what the first built instead of tearing its work down."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / BUILD_LOCK).open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"another process is preparing data in {cache}: waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # the lock ends when the file is closed


def prepare_data(profile: Profile, cache: Path, progress: Progress = lambda _: None) -> TokenData:
    """Corpus, tokenizer and token shards for `profile`, built on first use and then cached."""
    with _one_builder(cache, progress):
        return _prepare(profile, cache, progress)


def _prepare(profile: Profile, cache: Path, progress: Progress) -> TokenData:
    documents, text_hash = _documents(profile, cache, progress)
    key = hashlib.sha256(f"{text_hash} {profile.vocab_size} {profile.tokenizer_chars}".encode()).hexdigest()[:16]
    root = cache / "tokens" / f"{profile.data.replace(':', '-').replace('/', '_')}-{profile.vocab_size}-{key}"
    if (root / "manifest.json").exists():
        return TokenData(root, json.loads((root / "manifest.json").read_text()))
    work = root.with_name(root.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    progress(f"training a {profile.vocab_size}-token BPE tokenizer on {profile.tokenizer_chars / 1e6:.0f} M characters")
    read = [0]
    with _heartbeat(progress, lambda s: f"training the tokenizer: {read[0] / 1e6:.1f} M characters read, {s:.0f} s"):
        tokenizer = train_tokenizer(_tokenizer_text(documents("train"), profile.tokenizer_chars, read),
                                    profile.vocab_size, work / "tokenizer.tiktoken")
    np.save(work / "token_bytes.npy", tokenizer.token_bytes())
    counts = {split: _write_tokens(tokenizer, documents(split), work / f"{split}.bin", progress, split)
              for split in ("val", "train")}
    if counts["val"] < profile.seq_len + 1:
        raise TrainerError(f"the validation split of {profile.data} has only {counts['val']} tokens; it needs more text")
    digest = hashlib.sha256(tokenizer.sha256.encode())
    for split in ("train", "val"):
        with (work / f"{split}.bin").open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    manifest = {"data": profile.data, "text_sha256": text_hash, "tokenizer_sha256": tokenizer.sha256,
                "vocab_size": tokenizer.vocab_size, "bos_id": tokenizer.bos_id,
                "train_tokens": counts["train"], "val_tokens": counts["val"], "sha256": digest.hexdigest()}
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(root, ignore_errors=True)
    work.rename(root)
    return TokenData(root, manifest)
