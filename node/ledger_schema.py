"""The ledger's file format: its tables, and the steps that bring a ledger of an older release to
this one (`MIGRATIONS`, applied by `Ledger` when it opens a file). Released steps never change."""

from __future__ import annotations

from collections.abc import Callable

import sqlite_utils


def _schema_1(db: sqlite_utils.Database) -> None:
    """Release 1: facts with their raw signed bytes, and the tables derived from them."""
    db["facts"].create(
        {"id": str, "kind": str, "campaign": str, "author": str, "seq": int, "time": int,
         "received": int, "raw": bytes},
        pk="id", not_null=["kind", "campaign", "author", "seq", "time", "raw"],
    )  # fmt: skip
    db["facts"].create_index(["author", "seq"], unique=True)
    db["results"].create(
        {"id": str, "campaign": str, "author": str, "time": int, "profile": str, "parent": str,
         "child": str, "diff_sha256": str, "diff_size": int, "description": str, "harness": str,
         "seed": int, "outcome": str, "val_bpb": float, "steps": int, "tokens": int,
         "train_seconds": float, "total_seconds": float, "peak_memory_mb": float, "mfu": float},
        pk="id", foreign_keys=[("id", "facts", "id")],
    )  # fmt: skip
    db["results"].create_index(["time"])
    db["results"].create_index(["child"])
    db["results"].create_index(["outcome", "profile", "val_bpb", "child", "id"])
    db["verifications"].create(
        {"id": str, "campaign": str, "author": str, "time": int, "result": str,
         "child_val_bpb": float, "parent_val_bpb": float, "delta": float, "seed": int,
         "profile": str, "harness": str, "verdict": str},
        pk="id", foreign_keys=[("id", "facts", "id")],
    )  # fmt: skip
    db["verifications"].create_index(["result"])
    db["campaigns"].create(
        {"id": str, "name": str, "organiser": str, "program_sha256": str, "baseline": str,
         "profiles": str, "quorum": int, "data": str, "time": int},
        pk="id", foreign_keys=[("id", "facts", "id")],
    )  # fmt: skip
    db["versions"].create({"sha256": str, "size": int, "source": bytes, "added": int}, pk="sha256")
    db["peers"].create(
        {"peer_id": str, "public_key": str, "first_seen": int, "last_seen": int, "facts": int,
         "results": int, "verifications": int, "head_seq": int, "head": bytes},
        pk="peer_id", defaults={"facts": 0, "results": 0, "verifications": 0},
    )  # fmt: skip
    db["rejections"].create(
        {"peer_id": str, "reason": str, "count": int, "last_seen": int}, pk=("peer_id", "reason")
    )
    db["runs"].create(
        {"id": int, "started": int, "finished": int, "profile": str, "parent": str, "child": str,
         "outcome": str, "val_bpb": float, "description": str, "log_path": str, "fact_id": str},
        pk="id",
    )  # fmt: skip


def _schema_2(db: sqlite_utils.Database) -> None:
    """Release 2: paired measurements. A result carries its seeds, the child's and the parent's
    score on each (JSON lists), the device class and the budget; a verification its replay of
    the author's run and its device; a run its seed, harness and speed, so that a node pairs its
    own runs and knows how fast its machine trains."""
    for column, kind in (
        ("seeds", str),
        ("child_scores", str),
        ("parent_scores", str),
        ("parent_val_bpb", float),
        ("device", str),
        ("budget", int),
    ):
        db["results"].add_column(column, kind)
    db["verifications"].add_column("replay_val_bpb", float)
    db["verifications"].add_column("device", str)
    for column, kind in (("seed", int), ("harness", str), ("speed", float), ("device", str)):
        db["runs"].add_column(column, kind)
    db["runs"].create_index(["child", "seed"])


def _schema_3(db: sqlite_utils.Database) -> None:
    """Release 3: the campaign terms the ledger judges by (baseline, quorum, members), set by
    its node from the campaign file the user chose, never from a fact a stranger signed; and
    every kept claim's judgement under them, kept up to date at every look that arrives
    (`consensus.judge_claim`), so that the head reads the verified claims alone."""
    db["terms"].create(
        {"name": str, "organiser": str, "baseline": str, "quorum": int, "members": str,
         "fact": str, "set_ms": int},
        pk="name",
    )  # fmt: skip
    db["claims"].create(
        {"id": str, "profile": str, "harness": str, "parent": str, "child": str, "author": str,
         "state": str, "gain": float, "se": float, "seeds": int, "sigma": float, "peers": str,
         "outliers": str, "disputed": int, "author_z": float, "reason": str},
        pk="id",
    )  # fmt: skip
    db["claims"].create_index(["profile", "state"])


def _schema_4(db: sqlite_utils.Database) -> None:
    """Release 4: looks are cross-checked seed by seed (`evidence.cross_check`); a claim keeps
    the peers whose signed looks the replays contradicted, whose looks then count nowhere. A
    run says whether it was made because the run before it looked like a win."""
    db["claims"].add_column("contradicted", str)  # JSON list; NULL: nobody
    # A run made only because the run before it looked like a win: its pair's spread is no
    # measure of the noise (`noise.own_pairs`).
    db["runs"].add_column("selected", int)
    db.execute(
        "CREATE INDEX claims_contradicted ON claims (contradicted) WHERE contradicted IS NOT NULL"
    )


def _schema_5(db: sqlite_utils.Database) -> None:
    """Release 5: members the organiser invited after the campaign file was made, each from the
    time of its invitation (`Rules.members_for`)."""
    db["invitations"].create(
        {"id": str, "campaign": str, "organiser": str, "member": str, "time": int}, pk="id"
    )


def _schema_6(db: sqlite_utils.Database) -> None:
    """Release 6: a claim keeps the seats of the committee that judged it (JSON list; NULL in an
    open campaign), so that when a peer is contradicted, the claims whose committee it sat on
    are found without drawing every claim's committee again. `Ledger` judges every claim once
    when it brings a ledger to this release, which fills them. Looks are found by their author
    too (a node's own looks, a contradicted peer's) without reading them all."""
    db["claims"].add_column("seats", str)
    db["verifications"].create_index(["author", "result"])


def _schema_7(db: sqlite_utils.Database) -> None:
    """Release 7: a claim keeps the next members in rank after its committee's seats, its
    reserve (JSON list, in rank order), so that a contradicted member's heir is found without
    drawing the committee again; and who sits on which claim's committee is found by the
    member (`seats`) without reading every claim's. `Ledger` judges every claim once when it
    brings a ledger to this release, which fills both."""
    db["claims"].add_column("reserve", str)
    db.execute(
        "CREATE TABLE seats (member TEXT, claim TEXT, PRIMARY KEY (member, claim)) WITHOUT ROWID"
    )
    db.execute("CREATE INDEX seats_claim ON seats (claim)")


def _schema_8(db: sqlite_utils.Database) -> None:
    """Release 8: a claim keeps the head of its committee's ranking (`ranks`: the members that
    may judge it in rank, whether a replay contradicted them or not, up to a second committee's
    worth of those it did not), so that when a member is contradicted or backed again no row
    changes but those of the claims where a look changes sides: the seats are the first in rank
    not contradicted (`committees.seated`), found in the head, not kept. Release 7's seats and
    reserve go. `Ledger` judges every claim once when it brings a ledger to this release, which
    fills the heads."""
    db.execute("DROP TABLE seats")
    db.execute("ALTER TABLE claims DROP COLUMN reserve")
    db.execute("ALTER TABLE claims DROP COLUMN seats")
    db.execute(
        "CREATE TABLE ranks (member TEXT, claim TEXT, rank INTEGER, PRIMARY KEY (member, claim))"
        " WITHOUT ROWID"
    )
    db.execute("CREATE INDEX ranks_claim ON ranks (claim, rank)")


def _schema_9(db: sqlite_utils.Database) -> None:
    """Release 9: the claims of a peer that replays caught signing scores no run stands behind
    verify only once a replay of their own seed backs them (`consensus.suspects`); a claim found
    misreported keeps the peers whose replays found it so (JSON list), and the authors of such
    claims are found without reading every claim. `Ledger` judges every claim once when it
    brings a ledger to this release."""
    db["claims"].add_column("misreported_by", str)
    db.execute("CREATE INDEX claims_misreported ON claims (author) WHERE state = 'misreported'")


def _schema_10(db: sqlite_utils.Database) -> None:
    """Release 10: a claim is found void or misreported never on one peer's word
    (`evidence.disqualifying`); on one it waits for another peer's look. A claim keeps whether
    it waits for a replay of its author's seed (`awaits_replay`, 0 or 1), which standing reads
    as the pure rule does (before, the ledger's standing counted no overclaim of a claim that
    waited). `Ledger` judges every claim once when it brings a ledger to this release."""
    db["claims"].add_column("awaits_replay", int)


def _schema_11(db: sqlite_utils.Database) -> None:
    """Release 11: a claim its looks cannot yet decide, but whose author's claimed gain lies far
    above them, waits for a replay of its author's seed, and standing counts the overclaim; the
    author's word is weighed with the quorum - 1 looks least on its side left out
    (`evidence.Judgement.author_z`). No column changes: `Ledger` judges every claim once when it
    brings a ledger to this release."""
    del db


def _schema_12(db: sqlite_utils.Database) -> None:
    """Release 12: the replays of results' seeds are found without reading every verification:
    a replay of a discard that denies its signed score takes its author out of every proposer's
    evidence (`node.agent.discards`), read at every research step."""
    db.execute(
        "CREATE INDEX verifications_replays ON verifications (result) "
        "WHERE replay_val_bpb IS NOT NULL OR verdict = 'misreported'"
    )


# The release whose rule the kept judgements follow: `Ledger` judges the claims of a ledger of
# an older release (3 on, which keep judgements) once when it opens it.
JUDGED_BY = 11

# Index i brings a ledger from schema version i to i + 1. Append, never edit a released step.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _schema_1,
    _schema_2,
    _schema_3,
    _schema_4,
    _schema_5,
    _schema_6,
    _schema_7,
    _schema_8,
    _schema_9,
    _schema_10,
    _schema_11,
    _schema_12,
]
