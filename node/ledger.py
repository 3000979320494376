"""The ledger: every fact a node holds, in one SQLite file (WAL), and the tables derived from them.

Facts go in only through `ingest`, which validates them with `wire` and returns only after the
commit, so an acknowledged fact survives a kill -9. Readers may open the file while a node
writes. It never trusts a stored row it could re-check: `fact()` re-verifies the signature.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils

from node import wire
from node.identity import Identity, peer_id_from_public_key
from node.ledger_judged import JudgedClaims
from node.ledger_queries import LedgerError
from node.ledger_schema import JUDGED_BY, MIGRATIONS

LEDGER_FILE = "ledger.db"  # inside the node's home


def _now_ms() -> int:
    return int(time.time() * 1000)


def _insert(conn: sqlite3.Connection, table: str, row: Mapping[str, Any]) -> None:
    names = ", ".join(row)
    conn.execute(
        f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(row))})", tuple(row.values())
    )


def ledger_path(home: Path) -> Path:
    return Path(home) / LEDGER_FILE


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection. A WAL file is read through its -shm file, which SQLite must be
    able to create: where it cannot (a copy on a read-only disk, another user's folder), the
    file is read as immutable, which is right only when no -wal file holds commits it lacks."""
    uri = f"file:{path.resolve()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10)
    try:
        conn.execute("PRAGMA user_version").fetchone()
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        if "unable to open" not in str(exc) and "readonly" not in str(exc):
            raise
    wal = path.with_name(path.name + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise LedgerError(
            f"cannot read {path}: its folder is read-only and {wal.name} holds commits not yet in "
            "the file; copy both files to a writable folder"
        )
    return sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None, timeout=10)


# ---------------------------------------------------------------- the ledger


class Ledger(JudgedClaims):
    """One node's ledger. `campaign` (if set) is the only campaign whose facts it accepts."""

    def __init__(
        self, path: Path | str, campaign: str | None = None, readonly: bool = False,
        durable: bool = False, clock: Callable[[], int] = _now_ms,
    ) -> None:  # fmt: skip
        """`clock`: milliseconds since the epoch, for the facts this node signs and the skew
        check on those it receives (a simulation gives its virtual clock)."""
        self.path = Path(path)
        self.campaign = campaign
        self.readonly = readonly
        self.clock = clock
        try:
            if readonly:
                if not self.path.is_file():
                    raise LedgerError(f"no ledger at {self.path}")
                conn = _connect_readonly(self.path)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, isolation_level=None, timeout=10)
            self.conn = conn
            self.db = sqlite_utils.Database(conn)
            if not readonly:
                self.db.enable_wal()
                # In WAL mode NORMAL loses nothing on a process crash (kill -9): a commit is in
                # the OS once COMMIT returns. FULL adds an fsync per commit, for power loss.
                conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
                conn.execute("PRAGMA wal_autocheckpoint = 4000")
                self._migrate()
            self.schema_version = conn.execute("PRAGMA user_version").fetchone()[0]
            if readonly and self.schema_version == 0:
                raise LedgerError(
                    f"{self.path} is not a research-swarm ledger"
                    if self.db.table_names()
                    else f"{self.path} holds no ledger yet: a node may be creating it; try again"
                )
            if self.schema_version > len(MIGRATIONS):
                raise LedgerError(
                    f"{self.path} has schema {self.schema_version}, newer than this node "
                    f"understands ({len(MIGRATIONS)}): upgrade research-swarm"
                )
        except sqlite3.DatabaseError as exc:
            self._close_quietly()
            raise LedgerError(f"cannot open {self.path} as a ledger: {exc}") from None
        except LedgerError:
            self._close_quietly()
            raise

    def _close_quietly(self) -> None:
        if getattr(self, "conn", None) is not None:
            self.conn.close()

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self) -> None:
        with self._write():
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0 and self.db.table_names():
                raise LedgerError(f"{self.path} is an SQLite file but not a research-swarm ledger")
            for step in MIGRATIONS[version:]:
                step(self.db)
            self.conn.execute(f"PRAGMA user_version={max(version, len(MIGRATIONS))}")
            self.schema_version = max(version, len(MIGRATIONS))
            if 0 < version < JUDGED_BY:  # an older release's claims, judged under this rule
                self._judge_claims(self.conn)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        if self.readonly:
            raise LedgerError(f"{self.path} is open read-only")
        # IMMEDIATE takes the write lock up front, so two writers wait rather than deadlock.
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------ writing facts

    def ingest(
        self, raw: bytes, from_peer: str | None = None, now_ms: int | None = None
    ) -> wire.Fact | wire.Rejection:
        """Validate and store one message; returns the Fact (stored, or already held) or why not."""
        return self.ingest_many([raw], from_peer, now_ms)[0]

    def ingest_many(
        self, raws: Iterable[bytes], from_peer: str | None = None, now_ms: int | None = None
    ) -> list[wire.Fact | wire.Rejection]:
        """Validate and store messages in one transaction; returns after the commit.

        `from_peer` is the peer that delivered them (gossip), charged with the rejections.
        """
        now = self.clock() if now_ms is None else now_ms
        decoded = [wire.decode(raw, self.campaign, now) for raw in raws]
        with self._write() as conn:
            out = [
                self._store(conn, item, now) if isinstance(item, wire.Fact) else item
                for item in decoded
            ]
            for item in out:
                if isinstance(item, wire.Rejection):
                    self._count_rejection(conn, item, from_peer, now)
        return out

    def _store(
        self, conn: sqlite3.Connection, fact: wire.Fact, now: int
    ) -> wire.Fact | wire.Rejection:
        author = fact.peer_id
        if fact.kind == "head":
            return self._store_head(conn, fact, author, now)
        row = conn.execute(
            "SELECT id FROM facts WHERE author = ? AND seq = ?", (author, fact.seq)
        ).fetchone()
        rejection = wire.check_sequence(fact, row[0] if row else None, None)
        if rejection is not None:
            return rejection
        if row:  # the same fact again: already stored, nothing to do
            return fact
        if fact.kind == "campaign" and (organiser := self._organiser(conn)) not in (None, author):
            return wire.Rejection(
                wire.Reason.impostor, f"a campaign fact by {author}; its organiser is {organiser}"
            )
        if fact.kind == "invitation" and (organiser := self._organiser(conn)) not in (None, author):
            # A node that knows no organiser (a bootstrap) keeps and relays it; the rules count
            # only the organiser's (`rules`).
            return wire.Rejection(
                wire.Reason.impostor, f"an invitation by {author}; its organiser is {organiser}"
            )
        self._seen(conn, fact, author, now)
        conn.execute(
            "INSERT INTO facts (id, kind, campaign, author, seq, time, received, raw) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (fact.id, fact.kind, fact.campaign, author, fact.seq, fact.time, now, fact.raw),
        )
        body = fact.body
        if fact.kind == "result":
            m, parents = body["metrics"], body["parent_scores"]
            _insert(conn, "results", {
                "id": fact.id, "campaign": fact.campaign, "author": author, "time": fact.time,
                **{k: body[k] for k in ("profile", "parent", "child", "diff_sha256", "diff_size",
                                        "description", "harness", "seed", "outcome", "device",
                                        "budget")},
                **{k: m[k] for k in ("val_bpb", "steps", "tokens", "train_seconds",
                                     "total_seconds", "peak_memory_mb", "mfu")},
                "seeds": json.dumps(body["seeds"]),
                "child_scores": json.dumps(body["child_scores"]),
                "parent_scores": json.dumps(parents),
                "parent_val_bpb": sum(parents) / len(parents) if parents else None,
            })  # fmt: skip
            if body["outcome"] == "keep":
                self._judge_claims(conn, [fact.id])
        elif fact.kind == "verification":
            _insert(conn, "verifications", {
                "id": fact.id, "campaign": fact.campaign, "author": author, "time": fact.time,
                **{k: body[k] for k in ("result", "child_val_bpb", "parent_val_bpb", "delta",
                                        "seed", "profile", "harness", "verdict",
                                        "replay_val_bpb", "device")},
            })  # fmt: skip
            self._judge_claims(conn, [body["result"]])
        elif fact.kind == "campaign":
            conn.execute(
                "INSERT INTO campaigns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (fact.id, body["name"], peer_id_from_public_key(body["organiser"]),
                 body["program_sha256"], body["baseline"], json.dumps(body["profiles"]),
                 body["quorum"], json.dumps(body["data"], sort_keys=True), fact.time),
            )  # fmt: skip
        elif fact.kind == "invitation":
            conn.execute(
                "INSERT INTO invitations VALUES (?, ?, ?, ?, ?)",
                (
                    fact.id,
                    fact.campaign,
                    author,
                    peer_id_from_public_key(body["member"]),
                    fact.time,
                ),
            )
            # Claims made since the invitation are drawn from the members with the invitee.
            made = conn.execute(
                "SELECT id FROM results WHERE outcome = 'keep' AND time >= ?", (fact.time,)
            ).fetchall()
            if made:
                self._judge_claims(conn, [row[0] for row in made])
        return fact

    def _seen(self, conn: sqlite3.Connection, fact: wire.Fact, author: str, now: int) -> None:
        """Upsert the author's row in `peers`, counting the fact unless it is a head."""
        kept = fact.kind != "head"
        conn.execute(
            "INSERT INTO peers (peer_id, public_key, first_seen, last_seen, facts, results, "
            "verifications) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (peer_id) DO UPDATE SET "
            "last_seen = excluded.last_seen, facts = facts + excluded.facts, "
            "results = results + excluded.results, "
            "verifications = verifications + excluded.verifications",
            (author, fact.author.hex(), now, now, int(kept), int(fact.kind == "result"),
             int(fact.kind == "verification")),
        )  # fmt: skip

    def _store_head(
        self, conn: sqlite3.Connection, fact: wire.Fact, author: str, now: int
    ) -> wire.Fact | wire.Rejection:
        peer = conn.execute(
            "SELECT head_seq, head FROM peers WHERE peer_id = ?", (author,)
        ).fetchone()
        if peer and peer[1] == fact.raw:  # the same head again
            return fact
        rejection = wire.check_sequence(fact, None, peer[0] if peer else None)
        if rejection is not None:
            return rejection
        self._seen(conn, fact, author, now)
        conn.execute(
            "UPDATE peers SET head_seq = ?, head = ? WHERE peer_id = ?",
            (fact.seq, fact.raw, author),
        )
        return fact

    def _count_rejection(
        self, conn: sqlite3.Connection, rejection: wire.Rejection, from_peer: str | None, now: int
    ) -> None:
        # A fact its author signed (replay, seq_backwards, future_time: the signature has been
        # checked) is the author's doing, whoever relayed it; anything else, the courier's.
        # Anyone can claim to be anyone, so an unsigned claim of authorship blames no one.
        signed = rejection.reason in (wire.Reason.replay, wire.Reason.seq_backwards,
                                      wire.Reason.future_time)  # fmt: skip
        if signed and rejection.author:
            peer = peer_id_from_public_key(rejection.author)
        else:
            peer = from_peer or "unknown"
        conn.execute(
            "INSERT INTO rejections (peer_id, reason, count, last_seen) VALUES (?, ?, 1, ?) "
            "ON CONFLICT (peer_id, reason) DO UPDATE SET count = count + 1, last_seen = ?",
            (peer, rejection.reason.value, now, now),
        )

    def record_offences(self, offences: Mapping[tuple[str, str], int]) -> None:
        """Add counts of refused messages that never reached `ingest` ({(peer, reason): n}): what
        the gossip layer refused itself (floods, junk frames, bad libp2p signatures)."""
        now = self.clock()
        with self._write() as conn:
            for (peer, reason), n in offences.items():
                conn.execute(
                    "INSERT INTO rejections (peer_id, reason, count, last_seen) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (peer_id, reason) DO UPDATE SET count = count + ?, last_seen = ?",
                    (peer, reason, n, now, n, now),
                )

    def next_seq(self, public_key: bytes) -> int:
        """The sequence number this author's next fact should carry (heads count by the clock)."""
        row = self.conn.execute(
            "SELECT MAX(seq) FROM facts WHERE author = ?", (peer_id_from_public_key(public_key),)
        ).fetchone()
        return (row[0] or 0) + 1

    def publish(self, me: Identity, kind: str, body: dict, time_ms: int | None = None) -> wire.Fact:
        """Sign a fact as this node (next seq; a head counts by the clock), store it and return
        it, ready to gossip. Raises LedgerError if the ledger refuses it."""
        if self.campaign is None:
            raise LedgerError("open the ledger with a campaign to publish facts in it")
        now = self.clock() if time_ms is None else time_ms
        seq = now if kind == "head" else self.next_seq(me.public_key)
        fact = wire.sign(me, kind, self.campaign, seq, body, now)
        stored = self.ingest(fact.raw, now_ms=now)
        if isinstance(stored, wire.Rejection):
            raise LedgerError(
                f"this node's own {kind} was refused: {stored.reason.value}: {stored.detail}"
            )
        return fact

    # ------------------------------------------------------------ campaign terms

    def set_terms(self, terms: Mapping[str, Any]) -> None:
        """Judge this ledger's campaign by `terms` (name, baseline, quorum, and for a campaign
        file its organiser, members and fact id: `Campaign.terms`). The node sets them from what
        its user chose at start; a campaign fact from anyone else is refused from then on."""
        if self.campaign is not None and terms["name"] != self.campaign:
            raise LedgerError(f"terms of campaign {terms['name']} for a ledger of {self.campaign}")
        members = terms.get("members")
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO terms VALUES (?, ?, ?, ?, ?, ?, ?)",
                (terms["name"], terms.get("organiser"), terms["baseline"], int(terms["quorum"]),
                 None if members is None else json.dumps(sorted(members)), terms.get("fact"),
                 self.clock()),
            )  # fmt: skip
            self._judge_claims(conn)  # the rules changed: every claim is judged again

    def _organiser(self, conn: sqlite3.Connection) -> str | None:
        if self.campaign is None:
            return None
        row = conn.execute(
            "SELECT organiser FROM terms WHERE name = ?", (self.campaign,)
        ).fetchone()
        return row[0] if row else None

    # ------------------------------------------------------------ versions and runs

    def add_version(self, source: bytes, sha256: str | None = None) -> str:
        """Store a train.py by its sha256; if `sha256` is given the bytes must match it."""
        digest = hashlib.sha256(source).hexdigest()
        if sha256 is not None and digest != sha256:
            raise LedgerError(f"train.py bytes hash to {digest[:12]}, not {sha256[:12]}")
        with self._write() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO versions VALUES (?, ?, ?, ?)",
                (digest, len(source), source, self.clock()),
            )
        return digest

    def version(self, sha256: str) -> bytes | None:
        row = self.conn.execute(
            "SELECT source FROM versions WHERE sha256 = ?", (sha256,)
        ).fetchone()
        return row[0] if row else None

    def record_run(self, **run: Any) -> int:
        """Record one of this node's own runs (profile, parent, child, outcome, val_bpb,
        description, log_path, fact_id, started, finished); returns its run id."""
        allowed = {c.name for c in self.db["runs"].columns} - {"id"}
        if unknown := set(run) - allowed:
            raise LedgerError(f"unknown run fields: {sorted(unknown)}")
        with self._write() as conn:
            cols = ", ".join(run)
            cur = conn.execute(
                f"INSERT INTO runs ({cols}) VALUES ({', '.join('?' * len(run))})",
                tuple(run.values()),
            )
        return int(cur.lastrowid)

    def settle_runs(self, ids: Iterable[int], outcome: str, fact_id: str) -> None:
        """The runs of one experiment, recorded as each ended, take its outcome and its fact."""
        with self._write() as conn:
            conn.executemany(
                "UPDATE runs SET outcome = ?, fact_id = ? WHERE id = ?",
                [(outcome, fact_id, i) for i in ids],
            )
