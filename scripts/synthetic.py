"""Synthetic results for tests and benchmarks of the network: signed facts that name a train.py
of one comment line, published into a node's ledger the way a worker publishes (the node's
network gossips them as they appear). Nothing here trains."""

from __future__ import annotations

import os
import random
from pathlib import Path

from node import wire


def synthetic_result(seq: int) -> tuple[dict, bytes]:
    """A result fact body and the train.py it names."""
    source = f"# synthetic train.py {os.urandom(8).hex()} {seq}\n".encode()
    child = wire.content_ref(source)[0]
    body = wire.result_body(
        parent="0" * 64, child=child, diff=source, description=f"synthetic result {seq}",
        profile="test", harness="1" * 64, seed=seq, outcome="discard",
        metrics={"val_bpb": 1.0 + random.random() / 100, "steps": 1, "tokens": 1},
    )  # fmt: skip
    return body, source


def publish_synthetic(home: Path, campaign: str, seq: int) -> str:
    """Sign a synthetic result with HOME's key and store it and its train.py in HOME's ledger;
    its fact id."""
    from node.identity import load_identity
    from node.ledger import Ledger

    home.mkdir(parents=True, exist_ok=True)
    body, source = synthetic_result(seq)
    with Ledger(home / "ledger.db", campaign=campaign) as ledger:
        ledger.add_version(source)
        return ledger.publish(load_identity(home), "result", body).id
