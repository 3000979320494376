"""The node's network: the gossip transport wired to this node's ledger and to its judgement of
its peers. Data flows one way each: a peer's fact goes from the socket through `LedgerFacts`
into the ledger (which gives it its verdict); this node's own facts, whoever wrote them into the
ledger (a worker, `swarm campaign`), go from the ledger to the transport's `send`; and the node
judges its peers from the ledger and from what the transport refused, and tells the transport
whose facts to drop. A bare bootstrap (no campaign) archives many campaigns and judges no one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from node import standing
from node.gossip import GossipConfig, GossipNode, Verdict, run_peer
from node.identity import Identity, load_identity
from node.ledger import Ledger, ledger_path

log = logging.getLogger("swarm.network")
SEND_EVERY = 0.02  # seconds between looks at whether the ledger changed (a cheap pragma)
RECENT_RESULTS = 5000  # the results whose missing train.py the transport asks for again


class LedgerFacts:
    """The transport's `Facts` over one ledger connection (used on the transport's thread)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def accept(self, raws: list[bytes], peer: str) -> list[Verdict]:
        return list(self.ledger.ingest_many(raws, from_peer=peer))

    def holdings(self) -> dict[bytes, tuple[int, int]]:
        return self.ledger.holdings()

    def missing_from(
        self, authors: Mapping[bytes, int], share: int, bins: Iterable[int]
    ) -> Iterable[bytes]:
        return self.ledger.facts_missing_from(authors, share, list(bins))

    def version(self, sha256: str) -> bytes | None:
        return self.ledger.version(sha256)

    def add_version(self, data: bytes, sha256: str) -> None:
        self.ledger.add_version(data, sha256)

    def count(self) -> int:
        return self.ledger.rows("SELECT COUNT(*) AS n FROM facts")[0]["n"]

    def missing_versions(self, limit: int, per_author: int) -> list[tuple[str, str]]:
        rows = self.ledger.rows(
            "SELECT child, author FROM (SELECT r.child, r.author, MAX(r.rowid) AS last, "
            "ROW_NUMBER() OVER (PARTITION BY r.author ORDER BY MAX(r.rowid) DESC) AS nth "
            "FROM results r LEFT JOIN versions v ON v.sha256 = r.child "
            "WHERE v.sha256 IS NULL AND r.rowid > (SELECT MAX(rowid) FROM results) - ? "
            "GROUP BY r.child) WHERE nth <= ? ORDER BY last DESC LIMIT ?",
            (RECENT_RESULTS, per_author, limit),
        )
        return [(r["child"], r["author"]) for r in rows]


def judge(ledger: Ledger, transport: GossipNode) -> dict[str, standing.Standing]:
    """Record what the transport refused since the last time, then judge every peer. Refusals
    the ledger could not take (it was busy) go back to the transport for the next time."""
    if offences := transport.take_offences():
        try:
            ledger.record_offences(offences)
        except Exception:
            transport.untake_offences(offences)
            raise
    return standing.ledger_standing(ledger)


def run(
    config: GossipConfig,
    on_ready: Callable[[list[str]], None] | None = None,
    stop: threading.Event | None = None,
    say: Callable[[str], None] | None = None,
) -> None:
    """Be this node on the network until interrupted or `stop` is set (blocks).

    `on_ready` gets the node's full multiaddrs once it listens; `say` gets a line when a
    --bootstrap peer cannot be reached (dials go on) and when it connects."""
    identity = load_identity(config.home)
    path = ledger_path(config.home)
    ended = threading.Event()
    with Ledger(path, campaign=config.campaign) as ledger:
        transport = GossipNode(config, identity, LedgerFacts(ledger))
        transport.say = say or (lambda line: None)
        helpers = []
        if config.campaign is not None:
            helpers = [
                threading.Thread(target=_send_own, args=(path, identity, transport, ended),
                                 name="own facts", daemon=True),
                threading.Thread(target=_judge_peers, args=(path, config, transport, ended),
                                 name="standing", daemon=True),
            ]  # fmt: skip
        for helper in helpers:
            helper.start()
        try:
            run_peer(transport, on_ready, stop)
        finally:
            ended.set()
            for helper in helpers:
                helper.join(timeout=10)


def _send_own(
    path: Path, identity: Identity, transport: GossipNode, ended: threading.Event
) -> None:
    """Hand the transport each of this node's facts that enters the ledger from now on (those
    held before reach peers by sync)."""
    with Ledger(path, readonly=True) as ledger:
        sent, seen = ledger.next_seq(identity.public_key) - 1, None
        while not ended.wait(SEND_EVERY):
            try:
                # SQLite moves data_version when another connection commits: only then look.
                if (version := ledger.conn.execute("PRAGMA data_version").fetchone()[0]) == seen:
                    continue
                seen = version
                rows = ledger.rows(
                    "SELECT seq, raw FROM facts WHERE author = ? AND seq > ? ORDER BY seq LIMIT 256",
                    (identity.peer_id, sent),
                )
            except Exception as exc:  # a busy ledger: look again next time
                log.warning("own facts not read: %s", exc)
                continue
            for row in rows:
                transport.send(row["raw"])
                sent = row["seq"]
            if len(rows) == 256:  # more behind them: look again without waiting for a commit
                seen = None


def _judge_peers(
    path: Path, config: GossipConfig, transport: GossipNode, ended: threading.Event
) -> None:
    """Judge the peers again and again: the judgement reads the whole ledger, on a connection
    of its own, and a large ledger is judged less often."""
    with Ledger(path, campaign=config.campaign) as ledger:
        while True:
            began, before = time.monotonic(), transport.silenced
            try:
                judged = judge(ledger, transport)
                transport.set_standing(judged)
                for peer in sorted(transport.silenced - before):
                    log.warning("%s lost standing: %s", peer, "; ".join(judged[peer].reasons))
                for peer in sorted(before - transport.silenced):
                    log.warning("%s regained standing", peer)
            except Exception as exc:  # a busy ledger: judge again next time
                log.warning("standing not updated: %s", exc)
            took = time.monotonic() - began
            if ended.wait(max(config.limits.standing_every, 10 * took)):
                return
