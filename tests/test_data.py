"""The harness's data: corpus split, tokenizer hash, honest byte counts, bits-per-byte, web shards."""

from __future__ import annotations

import http.server
import math
import shutil
import subprocess
import sys
import threading
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from node.trainer import TrainerError, get_profile, prepare_data
from node.trainer.corpus import _deb_data, chunks, clean, is_validation
from node.trainer.scorer import evaluate_bpb
from node.trainer.tokenizer import load_tokenizer, train_tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 20,
    "Ünïcödé wörds, naïve café ✓ 東京 " * 20,
    "def f(x):\n    return x * 2\n" * 20,
]


def test_same_text_gives_the_same_tokenizer_hash_and_other_text_another(tmp_path):
    first = train_tokenizer(TEXTS, 300, tmp_path / "a.tiktoken")
    again = train_tokenizer(TEXTS, 300, tmp_path / "b.tiktoken")
    other = train_tokenizer(TEXTS[:2], 300, tmp_path / "c.tiktoken")
    assert first.sha256 == again.sha256
    assert (tmp_path / "a.tiktoken").read_bytes() == (tmp_path / "b.tiktoken").read_bytes()
    assert other.sha256 != first.sha256
    assert load_tokenizer(tmp_path / "a.tiktoken").sha256 == first.sha256


def test_token_bytes_count_raw_bytes_so_split_characters_are_not_inflated(tmp_path):
    tok = train_tokenizer(TEXTS, 270, tmp_path / "t.tiktoken")
    text = "naïve café ✓ 東京 🙂 ok"
    ids = tok.encoding.encode_ordinary(text)
    sizes = tok.token_bytes()
    assert int(sizes[ids].sum()) == len(text.encode("utf-8"))
    # Decoding each token on its own and re-encoding counts U+FFFD (3 bytes) for split characters.
    naive = sum(len(tok.encoding.decode([i]).encode("utf-8")) for i in ids)
    assert naive > len(text.encode("utf-8"))
    assert sizes[tok.bos_id] == 0


def test_bpb_matches_a_hand_computed_example_with_multibyte_tokens_and_bos_excluded():
    # Vocabulary of 4: token 0 is 1 byte, token 1 is 2 bytes (e.g. "é"), token 2 is 3 bytes ("✓"), 3 is BOS.
    token_bytes = np.array([1, 2, 3, 0], dtype=np.int32)
    val = np.array([3, 0, 1, 2, 0, 3, 2, 1, 0], dtype=np.uint16)  # 8 targets after the first token

    class Uniform(torch.nn.Module):  # every token equally likely: ln 4 nats per target
        def forward(self, idx):
            return torch.zeros(*idx.shape, 4)

    score = evaluate_bpb(
        Uniform(), val, token_bytes, seq_len=4, rows=2, batch_size=1, device=torch.device("cpu")
    )
    targets = val[1:9]
    counted = [t for t in targets if token_bytes[t] > 0]  # the BOS target is left out of both sums
    expected = (
        len(counted) * math.log(4) / (math.log(2) * sum(int(token_bytes[t]) for t in counted))
    )
    assert len(counted) == 7 and sum(int(token_bytes[t]) for t in counted) == 13
    assert score["val_bpb"] == pytest.approx(expected, rel=1e-6)  # float32 cross-entropy
    assert score["val_bpb"] == pytest.approx(7 * 2 / 13)  # ln 4 / ln 2 = 2 bits per counted target
    assert score["eval_tokens"] == 8 and score["eval_bytes"] == 13


def test_cleaning_and_chunking_are_deterministic():
    assert clean("a\r\nb\t c  \n\n\n\nd\x07") == "a\nb     c\n\nd"
    text = "\n\n".join(f"paragraph {i} " * 30 for i in range(50))
    parts = list(chunks(text, 1000))
    assert "\n\n".join(parts) == text
    assert all(len(p) >= 1000 for p in parts[:-1])
    assert is_validation("src", "some document") == is_validation("src", "some document")
    share = sum(is_validation("src", f"doc {i}") for i in range(20000)) / 20000
    assert 0.015 < share < 0.025


def test_a_file_that_is_not_a_debian_package_is_refused():
    with pytest.raises(TrainerError, match="not a Debian package"):
        _deb_data(b"PK\x03\x04 not an ar archive")


def test_the_small_corpus_builds_with_disjoint_splits_and_a_manifest(small_data, data_cache):
    manifest = data_cache / "corpus" / "small" / "manifest.json"
    assert manifest.exists()
    assert (
        small_data.manifest["val_tokens"] > 50_000
        and small_data.manifest["train_tokens"] > 1_000_000
    )
    assert small_data.manifest["vocab_size"] == get_profile("test").vocab_size
    train = set((data_cache / "corpus" / "small" / "train.txt").read_text().split("\0")[:300])
    val = set((data_cache / "corpus" / "small" / "val.txt").read_text().split("\0"))
    assert val and not (train & val)
    tokens = np.fromfile(small_data.val_path, dtype=np.uint16)
    assert (
        tokens[0] == small_data.manifest["bos_id"]
        and tokens.max() < small_data.manifest["vocab_size"]
    )
    again = prepare_data(get_profile("test"), data_cache)
    assert again.sha256 == small_data.sha256


# ---------------------------------------------------------------------------------------------
# Web-scale shards from a URL list, served by a real HTTP server on loopback


@pytest.fixture
def shard_server(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(words, 200)) + "." for _ in range(200)]
    pq.write_table(
        pa.table({"text": docs[:100], "id": list(range(100))}), served / "shard_0.parquet"
    )
    pq.write_table(pa.table({"text": docs[100:180]}), served / "shard_1.parquet")
    (served / "val.txt").write_text("\n\n\n".join(docs[180:]))
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.slow
def test_two_processes_sharing_a_cache_build_it_once_and_both_get_the_same_data(
    small_data, data_cache, tmp_path
):
    shared = tmp_path / "shared"
    shutil.copytree(
        data_cache / "downloads", shared / "downloads"
    )  # no second fetch from the registries
    code = (
        "import sys; from pathlib import Path; from node.trainer import get_profile, prepare_data; "
        "print(prepare_data(get_profile('test'), Path(sys.argv[1]), print).sha256)"
    )
    both = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(shared)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=600)[0] for process in both]
    assert [process.returncode for process in both] == [0, 0], outputs
    assert {out.strip().splitlines()[-1] for out in outputs} == {small_data.sha256}
    assert any("waiting for it" in out for out in outputs)  # the second waited for the first
    assert not list(shared.glob("*/*.partial"))


def test_web_shards_download_from_a_url_list_and_the_last_one_is_validation(shard_server, tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text(
        f"# two training shards, then validation\n{shard_server}/shard_0.parquet\n"
        f"{shard_server}/shard_1.parquet\n{shard_server}/val.txt\n"
    )
    profile = get_profile("test", f"urls:{urls}")
    data = prepare_data(profile, tmp_path / "cache")
    tok = data.tokenizer()
    val = np.fromfile(data.val_path, dtype=np.uint16)
    assert (val == tok.bos_id).sum() == 20  # the 20 documents of val.txt
    assert (np.fromfile(data.train_path, dtype=np.uint16) == tok.bos_id).sum() == 180
    assert len(list((tmp_path / "cache" / "web").iterdir())) == 3


def test_a_shard_whose_hash_differs_from_its_pin_is_refused(shard_server, tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text(f"{shard_server}/shard_0.parquet {'0' * 64}\n{shard_server}/val.txt\n")
    with pytest.raises(TrainerError, match="does not match the pinned"):
        prepare_data(get_profile("test", f"urls:{urls}"), tmp_path / "cache")
    assert not list((tmp_path / "cache" / "web").glob("*shard_0*"))


def test_url_list_mistakes_name_the_line(tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text("https://example.invalid/a.parquet\nnot a url\n")
    with pytest.raises(TrainerError, match=r"urls.txt:2: expected `URL \[sha256\]`"):
        prepare_data(get_profile("test", f"urls:{urls}"), tmp_path / "cache")


def test_a_long_tokenizer_training_says_it_is_still_going(shard_server, tmp_path, monkeypatch):
    import time

    from node.trainer import data as data_module

    real = data_module.train_tokenizer

    def slow(texts, vocab_size, path):  # reads all the text, as rustbpe does, then takes a while
        texts = list(texts)
        time.sleep(0.6)
        return real(texts, vocab_size, path)

    monkeypatch.setattr(data_module, "train_tokenizer", slow)
    monkeypatch.setattr(data_module, "HEARTBEAT_SECONDS", 0.1)
    urls = tmp_path / "urls.txt"
    urls.write_text(f"{shard_server}/shard_0.parquet\n{shard_server}/val.txt\n")
    lines: list[str] = []
    prepare_data(get_profile("test", f"urls:{urls}"), tmp_path / "cache", lines.append)
    beats = [i for i, line in enumerate(lines) if line.startswith("training the tokenizer:")]
    assert len(beats) >= 3, lines
    assert "0.1 M characters read" in lines[beats[-1]]  # shard_0: 100 documents of ~1,200
    assert beats[-1] < next(i for i, line in enumerate(lines) if line.startswith("tokenized val"))
