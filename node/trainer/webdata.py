"""A web-scale corpus the user downloads: text or parquet shards from a list of URLs.

The last shard of the list is the validation split; the others are training text. Shards are
downloaded once into the cache (resumable: a partial file is fetched again), checked against a
sha256 when the list gives one, and read as documents. Part of the harness.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from node.trainer.errors import TrainerError

# The gpu profile's default: FineWeb-Edu, shuffled and cut into ~100 MB parquet shards.
FINEWEB_EDU = "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main/shard_{:05d}.parquet"
WEB_CORPORA = {
    # 16 training shards (~1.6 B characters) and one validation shard.
    "fineweb-edu": [FINEWEB_EDU.format(i) for i in range(16)] + [FINEWEB_EDU.format(1822)],
}


@dataclass(frozen=True)
class Shard:
    url: str
    sha256: str = ""  # optional pin; checked after download when given


def read_url_list(path: Path) -> list[Shard]:
    """A URL list file: one `URL [sha256]` per line; blank lines and `#` comments are skipped."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise TrainerError(f"cannot read URL list {path}: {exc.strerror}") from exc
    shards = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 2 or not words[0].startswith(("http://", "https://", "file://")):
            raise TrainerError(f"{path}:{number}: expected `URL [sha256]`, got {line.strip()!r}")
        shards.append(Shard(words[0], words[1] if len(words) == 2 else ""))
    if len(shards) < 2:
        raise TrainerError(f"{path}: a URL list needs at least 2 shards (training shards, then one validation shard)")
    return shards


def require_pyarrow(what: str) -> None:
    """Parquet is read with pyarrow, an extra: say which one before any shard is fetched."""
    if importlib.util.find_spec("pyarrow") is None:
        raise TrainerError(
            f"{what}: parquet shards need pyarrow: pip install 'research-swarm[web]'"
        )


def download(shard: Shard, folder: Path, progress: Callable[[str], None]) -> Path:
    """Fetch one shard into `folder` unless it is already complete there."""
    name = hashlib.sha256(shard.url.encode()).hexdigest()[:16] + "-" + shard.url.rsplit("/", 1)[-1]
    dest = folder / name
    if dest.exists():
        return dest
    if name.endswith(".parquet"):
        require_pyarrow(shard.url)  # before the download, not after it
    folder.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    progress(f"downloading {shard.url}")
    try:
        with urllib.request.urlopen(shard.url, timeout=120) as response, partial.open("wb") as out:
            total, got, shown = int(response.headers.get("Content-Length") or 0), 0, time.monotonic()
            while block := response.read(1 << 20):
                out.write(block)
                got += len(block)
                if time.monotonic() - shown > 2:
                    of = f" of {total / 1e6:.0f}" if total else ""
                    progress(f"downloading {shard.url.rsplit('/', 1)[-1]}: {got / 1e6:.0f}{of} MB")
                    shown = time.monotonic()
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise TrainerError(f"could not download {shard.url}: {exc}; check the URL and the network, then try again") from exc
    if shard.sha256:
        got = hashlib.sha256(partial.read_bytes()).hexdigest()
        if got != shard.sha256:
            partial.unlink()
            raise TrainerError(f"{shard.url}: sha256 {got} does not match the pinned {shard.sha256}")
    partial.replace(dest)
    return dest


def documents(path: Path) -> Iterator[str]:
    """The documents of one shard: a parquet `text` column, JSON lines with `text`, or plain text."""
    name = path.name.removesuffix(".partial")
    try:
        if name.endswith(".parquet"):
            require_pyarrow(str(path))
            import pyarrow.parquet as pq

            table = pq.ParquetFile(path)
            if "text" not in table.schema_arrow.names:
                raise TrainerError(f"{path}: parquet shard has no `text` column (columns: {table.schema_arrow.names})")
            for group in range(table.num_row_groups):
                yield from (t for t in table.read_row_group(group, columns=["text"]).column(0).to_pylist() if t)
            return
        raw = path.read_bytes()
        if name.endswith(".gz"):
            raw = gzip.decompress(raw)
            name = name.removesuffix(".gz")
        text = raw.decode("utf-8", "replace")
        if name.endswith((".jsonl", ".json")):
            for line in text.splitlines():
                if line.strip():
                    yield json.loads(line)["text"]
        else:
            yield from (doc for doc in text.split("\n\n\n") if doc.strip())
    except TrainerError:
        raise
    except Exception as exc:  # a corrupt shard of any format ends here with its path
        raise TrainerError(f"{path}: cannot read shard ({exc}); delete it to download it again") from exc
