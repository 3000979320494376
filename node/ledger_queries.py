"""What a ledger answers: the read-only questions of `swarm ledger`, the report, the head and
sync (what it holds, what a peer lacks).

`LedgerQueries` is the reading half of `Ledger` (node/ledger.py, which stores): it reads the
facts and the derived tables and never writes. Queries that walk long lists read them a page at
a time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack

from node import consensus, wire
from node.errors import SwarmError
from node.evidence import Judgement
from node.identity import peer_id_from_public_key

MAX_LINEAGE = 10_000  # steps walked back before giving up (parent links may loop)
_PAGE = 500  # rows per query where a query walks a long list
# What `consensus` reads of each row.
RESULT_COLUMNS = ("id, author, time, profile, parent, child, harness, outcome, val_bpb, "
                  "description, seeds, child_scores, parent_scores, device")  # fmt: skip
LOOK_COLUMNS = (
    "result, author, verdict, profile, harness, delta, seed, replay_val_bpb, device, "
    "child_val_bpb, parent_val_bpb"
)


@functools.cache
def builtin_baseline() -> str:
    """The sha256 of this version's built-in train.py: the baseline of a campaign without a file."""
    from node.trainer import BASELINE_TRAIN_PY

    return hashlib.sha256(BASELINE_TRAIN_PY.read_bytes()).hexdigest()


_JUDGED = ("state", "gain", "se", "seeds", "sigma", "peers", "outliers", "disputed", "author_z",
           "reason", "contradicted", "misreported_by", "awaits_replay")  # fmt: skip


def _judgement(row: Mapping[str, Any]) -> Judgement:
    """A claim's judgement as the ledger keeps it (`claims`)."""
    return Judgement(
        row["state"], row["gain"], row["se"], row["seeds"], row["sigma"],
        tuple(json.loads(row["peers"])), tuple(json.loads(row["outliers"])),
        bool(row["disputed"]), row["author_z"], row["reason"],
        tuple(json.loads(row.get("contradicted") or "[]")),
        awaits_replay=bool(row.get("awaits_replay")),
        misreported_by=tuple(json.loads(row.get("misreported_by") or "[]")),
    )  # fmt: skip


def _entry(score: consensus.Score, r: Mapping[str, Any], j: Judgement) -> dict:
    return {"child": score.version, "parent": r["parent"], "result": r["id"],
            "score": score.score, "se": score.se, "gain": j.gain, "gain_se": j.se,
            "seeds": j.seeds, "steps": score.steps, "found_by": r["author"],
            "verified_by": list(j.peers), "description": r["description"],
            "val_bpb": r["val_bpb"], "time": r["time"], "profile": r["profile"]}  # fmt: skip


# What other peers' looks said of a peer's results, as `peers` counts them: (its result's
# outcome, the look's verdict, the count's name). A replay of a discard is "confirm" or
# "misreported" (`node.agent.discards`).
_VERDICTS_GOT = (
    ("keep", "confirm", "confirmations"),
    ("keep", "refute", "refutations"),
    ("keep", "void", "voids"),
    ("discard", "confirm", "discards_backed"),
    ("discard", "misreported", "discards_denied"),
)


class LedgerError(SwarmError):
    """A ledger file that is missing, not a ledger, too new, or a query about something absent."""


class LedgerQueries:
    """The read-only questions a `Ledger` answers (it provides `conn`, `path` and `rows`)."""

    conn: sqlite3.Connection
    path: Path
    schema_version: int
    campaign: str | None

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict]:
        cur = self.conn.execute(sql, tuple(params))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def summary(self) -> dict:
        one = lambda sql: self.conn.execute(sql).fetchone()[0]  # noqa: E731
        return {
            "path": str(self.path),
            "schema_version": self.schema_version,
            # Counted from the derived tables' indexes: scanning `facts` reads every raw blob.
            "facts": {
                kind: n
                for kind, table in (("result", "results"), ("verification", "verifications"),
                                    ("campaign", "campaigns"))
                if (n := one(f"SELECT COUNT(*) FROM {table}"))
            },
            "outcomes": dict(self.conn.execute("SELECT outcome, COUNT(*) FROM results GROUP BY 1")),
            "verdicts": dict(self.conn.execute("SELECT verdict, COUNT(*) FROM verifications GROUP BY 1")),
            "peers": one("SELECT COUNT(*) FROM peers"),
            "versions": one("SELECT COUNT(*) FROM versions"),
            "runs": one("SELECT COUNT(*) FROM runs"),
            "rejected": dict(self.conn.execute("SELECT reason, SUM(count) FROM rejections GROUP BY 1")),
            "campaigns": [r["name"] for r in self.rows("SELECT name FROM campaigns ORDER BY time")],
            "last_received": one("SELECT MAX(received) FROM (SELECT received FROM facts "
                                 "ORDER BY rowid DESC LIMIT 1)"),
        }  # fmt: skip

    # ------------------------------------------------------------ the rule, as this ledger applies it

    def terms(self) -> dict | None:
        """The campaign terms its node set (`Ledger.set_terms`); None when none were set."""
        if self.schema_version < 3:
            return None
        if self.campaign is not None:
            rows = self.rows("SELECT * FROM terms WHERE name = ?", (self.campaign,))
        else:  # a ledger opened for reading: the campaign its node set terms for
            rows = self.rows("SELECT * FROM terms ORDER BY set_ms DESC LIMIT 1")
        if not rows:
            return None
        terms = rows[0]
        terms["members"] = None if terms["members"] is None else json.loads(terms["members"])
        return terms

    def baseline(self) -> str:
        """The sha256 of the train.py every lineage starts from: the campaign's, else built in."""
        terms = self.terms()
        return terms["baseline"] if terms else builtin_baseline()

    def quorum(self) -> int:
        terms = self.terms()
        return terms["quorum"] if terms else 1

    def rules(self, profile: str, quorum: int | None = None) -> consensus.Rules:
        """The rules claims on `profile` are judged by: the campaign's quorum (or `quorum`) and
        members, the profile's paired noise and replay tolerance."""
        from node.trainer.profiles import PROFILES

        terms = self.terms()
        members = terms["members"] if terms else None
        quorum = quorum or self.quorum()
        known = PROFILES.get(profile)
        if known is None:  # a profile this version does not know: judged on the defaults
            rules = consensus.Rules(quorum, members=None if members is None else frozenset(members))
        else:
            rules = consensus.Rules.of(known, quorum, members)
        if members is None:
            return rules
        return replace(rules, invited=self.invited(terms["name"], terms["organiser"]))

    def invited(self, campaign: str, organiser: str | None) -> tuple[tuple[str, int], ...]:
        """The members `organiser` invited into `campaign`, each with the time of its first
        invitation, by peer id."""
        if self.schema_version < 5:
            return ()
        rows = self.rows(
            "SELECT member, MIN(time) AS since FROM invitations WHERE campaign = ? AND organiser = ? "
            "GROUP BY member ORDER BY member",
            (campaign, organiser),
        )  # fmt: skip
        return tuple((r["member"], r["since"]) for r in rows)

    def claim_rows(self, profile: str) -> tuple[list[dict], list[dict]]:
        """(kept results, verifications) of `profile`: every row the rule reads."""
        results = self.rows(
            f"SELECT {RESULT_COLUMNS} FROM results WHERE profile = ? AND outcome = 'keep'",
            (profile,),
        )
        verifications = self.rows(
            f"SELECT {LOOK_COLUMNS} FROM verifications WHERE profile = ?", (profile,)
        )
        return results, verifications

    def standings(
        self, profile: str, quorum: int | None = None, harness: str | None = None,
        reach: Callable[[Mapping[str, Any]], bool] | None = None, baseline: str | None = None,
        every: bool = False,
    ) -> tuple[dict[str, consensus.Score], dict[str, Judgement], list[dict]]:  # fmt: skip
        """(the versions' scores, the claims' judgements, their result rows) on `profile`, from
        the campaign's baseline (or `baseline`) under its rules (`rules`): the verified claims
        alone, or `every` claim. Under the terms' own quorum the judgements are the ones the
        ledger keeps up to date at every look (`claims`); under another, judged now."""
        rules = self.rules(profile, quorum)
        if self.schema_version < 3 or rules.quorum != self.quorum():
            results, verifications = self.claim_rows(profile)
            results = consensus.versions_of(results, profile, harness)
            judged = consensus.judge_claims(results, verifications, rules)
        else:
            where = "" if every else " AND c.state = 'verified'"
            rows = self.rows(
                f"SELECT c.*, r.time, r.description, r.val_bpb, r.outcome, r.child_scores, "
                f"r.parent_scores, r.device FROM claims c JOIN results r ON r.id = c.id "
                f"WHERE c.profile = ?{where}" + (" AND c.harness = ?" if harness else ""),
                (profile, harness) if harness else (profile,),
            )  # fmt: skip
            results = [{k: r[k] for k in r if k not in _JUDGED} for r in rows]
            judged = consensus.settle(
                {r["id"]: _judgement(r) for r in rows}, {r["id"]: r for r in results}
            )
        scores = consensus.lineage_scores(results, judged, baseline or self.baseline(), reach)
        return scores, judged, results

    def head(
        self, profile: str, quorum: int | None = None, harness: str | None = None,
        reach: Callable[[Mapping[str, Any]], bool] | None = None, baseline: str | None = None,
    ) -> str:  # fmt: skip
        """The swarm's best train.py (sha256) of `profile`: `consensus.best_head` over this
        ledger's facts."""
        return consensus.head_of(self.standings(profile, quorum, harness, reach, baseline)[0])

    def experiments(
        self, peer: str | None = None, outcome: str | None = None, profile: str | None = None,
        limit: int = 50, quorum: int | None = None,
    ) -> list[dict]:  # fmt: skip
        """Results, newest first, with how many peers confirmed, refuted, could not tell
        (inconclusive) and found void each, and each claim's state under the rule (`state`,
        `gain`, `gain_se`, `seeds`, `why`; None for a result that is no claim).

        `peer` is a peer id or its tail (tables show the tail: every id starts 12D3KooW).
        """
        where, params = [], []
        if peer:
            where.append("substr(r.author, -?) = ?")
            params += [len(peer), peer]
        for column, value in (("outcome", outcome), ("profile", profile)):
            if value is not None:
                where.append(f"r.{column} = ?")
                params.append(value)
        counts = ", ".join(
            f"(SELECT COUNT(*) FROM verifications v WHERE v.result = r.id AND v.verdict = "
            f"'{verdict}') AS {name}"
            for verdict, name in (("confirm", "confirmations"), ("refute", "refutations"),
                                  ("inconclusive", "inconclusive"), ("void", "voids"))
        )  # fmt: skip
        sql = (
            f"SELECT r.*, {counts} FROM results r"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY r.time DESC, r.id LIMIT ?"
        )
        rows = self.rows(sql, [*params, limit])
        judged: dict[str, Judgement] = {}
        for claimed in sorted({r["profile"] for r in rows if r["outcome"] == "keep"}):
            judged.update(self.standings(claimed, quorum, every=True)[1])
        for r in rows:
            j = judged.get(r["id"])
            r.update(state=j.state if j else None, gain=j.gain if j else None,
                     gain_se=j.se if j else None, seeds=j.seeds if j else 0,
                     why=j.reason if j else None)  # fmt: skip
            r["held"] = j.reason if j is not None and j.state == consensus.HELD else None
        return rows

    def profiles(self) -> list[str]:
        """The profiles this ledger holds kept claims of."""
        rows = self.conn.execute(
            "SELECT DISTINCT profile FROM results WHERE outcome = 'keep' ORDER BY profile"
        )
        return [profile for (profile,) in rows.fetchall()]

    def held_claims(
        self, quorum: int | None = None, profiles: Iterable[str] | None = None
    ) -> dict[str, str]:
        """{result id: why it is held}: claims held as outliers for more looks, on `profiles`
        (default: all)."""
        held: dict[str, str] = {}
        for profile in self.profiles() if profiles is None else profiles:
            judged = self.standings(profile, quorum)[1]
            held.update({rid: j.reason for rid, j in judged.items() if j.state == consensus.HELD})
        return held

    def held(self, quorum: int | None = None) -> dict[str, list[dict]]:
        """Per profile, the claims held as outliers (largest gain first), each with why."""
        out: dict[str, list[dict]] = {}
        for profile in self.profiles():
            _, judged, results = self.standings(profile, quorum)
            rows = sorted((r for r in results if judged[r["id"]].state == consensus.HELD),
                          key=lambda r: (-(judged[r["id"]].gain or 0.0), r["id"]))  # fmt: skip
            if rows:
                out[profile] = [{**r, "reason": judged[r["id"]].reason,
                                 "gain": judged[r["id"]].gain} for r in rows]  # fmt: skip
        return out

    def leaderboard(self, quorum: int | None = None, limit: int = 10) -> dict[str, list[dict]]:
        """Per profile, the best versions reached from the baseline through verified claims,
        best score first (ties by hash): the rule of `consensus.best_head`, so the first entry
        is the head. A score is minus the verified gains from the baseline (bpb): claimed
        val_bpb ranks nothing. Each entry: child, parent, result (the claim that reached it),
        score, se, gain and gain_se (its last step's), seeds, steps, found_by, verified_by (the
        peers whose looks the gain pools), description, val_bpb (what its author claimed)."""
        board: dict[str, list[dict]] = {}
        for profile in self.profiles():
            scores, judged, results = self.standings(profile, quorum)
            by_id = {r["id"]: r for r in results}
            ranked = sorted((s for s in scores.values() if s.via is not None),
                            key=lambda s: (s.score, s.version))[:limit]  # fmt: skip
            if ranked:
                board[profile] = [_entry(s, by_id[s.via], judged[s.via]) for s in ranked]
        return board

    def lineage(self, child: str) -> list[dict]:
        """The chain of versions from the baseline to `child` (a sha256 or a unique prefix).

        Each step is the earliest kept result that made that version, with its description, diff
        size, claimed delta against its parent and the mean delta its confirmations measured.
        """
        child = self._expand(
            child, "SELECT DISTINCT child FROM results WHERE child BETWEEN ? AND ?"
        )
        chain: list[str] = []
        seen: set[str] = set()
        current = child
        while current not in seen and len(chain) < MAX_LINEAGE:  # parent links may loop
            seen.add(current)
            row = self.conn.execute(
                "SELECT id, parent FROM results WHERE child = ? "
                "ORDER BY (outcome = 'keep') DESC, time, id LIMIT 1",
                (current,),
            ).fetchone()
            if row is None:
                break
            chain.append(row[0])
            current = row[1]
        if not chain:
            raise LedgerError(f"no result made version {child[:12]}: nothing to trace")
        steps: dict[str, dict] = {}
        for start in range(0, len(chain), _PAGE):
            ids = chain[start : start + _PAGE]
            marks = ", ".join("?" * len(ids))
            for r in self.rows(
                "SELECT id, author, time, profile, parent, child, description, diff_size, val_bpb, "
                f"outcome, NULL AS verified_delta, 0 AS confirmations FROM results WHERE id IN ({marks})",
                ids,
            ):
                steps[r["id"]] = r
            for result, delta, count in self.conn.execute(
                "SELECT result, AVG(delta), COUNT(*) FROM verifications "
                f"WHERE verdict = 'confirm' AND result IN ({marks}) GROUP BY result",
                ids,
            ):
                steps[result]["verified_delta"], steps[result]["confirmations"] = delta, count
        ordered = [steps[i] for i in reversed(chain)]
        for prev, step in zip([None, *ordered[:-1]], ordered, strict=True):
            parent_bpb = prev["val_bpb"] if prev else None
            known = step["val_bpb"] is not None and parent_bpb is not None
            step["delta"] = step["val_bpb"] - parent_bpb if known else None
        return ordered

    def peers(self) -> list[dict]:
        """Every peer seen: facts, results, confirmations, refutations and voids its claims
        received, the replays of its discards that backed and that denied them
        (`node.agent.discards`), and the messages rejected from it by reason."""
        # CROSS JOIN keeps SQLite walking verifications (fewer) rather than every result.
        standing = {
            r["author"]: r
            for r in self.rows(
                "SELECT r.author, " + ", ".join(
                    f"SUM(r.outcome = '{outcome}' AND v.verdict = '{verdict}') AS {name}"
                    for outcome, verdict, name in _VERDICTS_GOT
                ) + " FROM verifications v CROSS "
                "JOIN results r ON r.id = v.result AND v.author != r.author GROUP BY r.author"
            )
        }  # fmt: skip
        names = [name for _, _, name in _VERDICTS_GOT]
        rejected: dict[str, dict[str, int]] = {}
        for peer, reason, count in self.conn.execute(
            "SELECT peer_id, reason, count FROM rejections"
        ):
            rejected.setdefault(peer, {})[reason] = count
        out = []
        for p in self.rows(
            "SELECT peer_id, first_seen, last_seen, facts, results, verifications FROM peers"
        ):
            s = standing.get(p["peer_id"], {})
            p.update({name: s.get(name) or 0 for name in names})
            p["rejected"] = rejected.pop(p["peer_id"], {})
            out.append(p)
        for peer, reasons in rejected.items():  # peers only ever heard from with junk
            out.append({"peer_id": peer, "first_seen": None, "last_seen": None, "facts": 0,
                        "results": 0, "verifications": 0, **dict.fromkeys(names, 0),
                        "rejected": reasons})  # fmt: skip
        return sorted(out, key=lambda p: (-(p["last_seen"] or 0), p["peer_id"]))

    def fact(self, fact_id: str) -> dict:
        """One stored fact (id or unique prefix), decoded, with its signature checked again."""
        fact_id = self._expand(fact_id, "SELECT id FROM facts WHERE id BETWEEN ? AND ?")
        row = self.rows("SELECT * FROM facts WHERE id = ?", (fact_id,))[0]
        check = wire.decode(row["raw"], None, now_ms=row["time"])
        try:
            envelope = msgpack.unpackb(row["raw"], raw=False, strict_map_key=False)
        except Exception:
            envelope = None
        status = (
            "valid" if isinstance(check, wire.Fact) else f"{check.reason.value}: {check.detail}"
        )
        return {"id": fact_id, "received": row["received"], "status": status, "envelope": envelope}

    # ------------------------------------------------------------ what sync asks

    def head_body(self) -> dict:
        """This node's `head`: what it holds, for peers that want to know what they lack.

        Per author it gives n such that it holds every fact with seq 1..n (`head_authors`).
        """
        ids = [r[0] for r in self.conn.execute("SELECT id FROM facts")]
        best = {p: head for p in self.profiles() if (head := self.head(p)) != self.baseline()}
        return wire.head_body(ids, self.holdings(), best)

    def head_authors(self) -> dict[bytes, int]:
        """Per author, the n such that this ledger holds every fact with seq 1..n: facts may
        arrive out of order, and a peer must still send the ones below the highest that are
        missing here. All that sync asks of a head, without the leaderboard's cost."""
        return {key: held for key, (held, _) in self.holdings().items()}

    def holdings(self) -> dict[bytes, tuple[int, int]]:
        """Per author, (the n of `head_authors`, the highest seq held): what a head's bins
        digest (`wire.head_bins`), so that facts held beyond a gap make a bin differ too."""
        return {
            bytes.fromhex(key): (held, highest)
            for key, held, highest in self.conn.execute(
                "SELECT p.public_key, CASE WHEN MIN(f.seq) > 1 THEN 0 "
                "WHEN COUNT(*) = MAX(f.seq) THEN MAX(f.seq) "
                "ELSE (SELECT MIN(g.seq) FROM facts g WHERE g.author = f.author AND NOT EXISTS "
                "(SELECT 1 FROM facts h WHERE h.author = g.author AND h.seq = g.seq + 1)) END, "
                "MAX(f.seq) FROM facts f JOIN peers p ON p.peer_id = f.author GROUP BY f.author "
                # A head has room for MAX_HEAD_AUTHORS; past that, the most recently active.
                "ORDER BY MAX(f.time) DESC LIMIT ?",
                (wire.MAX_HEAD_AUTHORS,),
            )
        }

    def facts_missing_from(
        self, authors: Mapping[bytes, int], per_author: int | None = None,
        bins: Collection[int] | None = None,
    ) -> Iterator[bytes]:  # fmt: skip
        """The raw facts a peer lacks, judged by its `authors` ({public key: the seq up to which
        it holds everything}, as `head_authors` gives them): for each author, those above that
        seq. Some may be held already (gaps): harmless. `bins`: only the authors of those head
        bins (`wire.bin_of`), where the peer's entries are all given. `per_author` caps each
        author's share, so that one author's many facts cannot crowd out the others' (the peer
        asks again for the rest)."""
        held = {peer_id_from_public_key(key): n for key, n in authors.items()}
        rows = self.conn.execute(
            "SELECT DISTINCT f.author, p.public_key FROM facts f "
            "LEFT JOIN peers p ON p.peer_id = f.author"
        ).fetchall()
        wanted = None if bins is None else set(bins)
        for author, key in rows:
            if wanted is not None and (
                key is None or wire.bin_of(bytes.fromhex(key)) not in wanted
            ):
                continue
            facts = self.conn.execute(
                "SELECT raw FROM facts WHERE author = ? AND seq > ? ORDER BY seq LIMIT ?",
                (author, held.get(author, 0), -1 if per_author is None else per_author),
            )
            yield from (raw for (raw,) in facts)

    def _expand(self, prefix: str, sql: str) -> str:
        if not prefix or any(c not in "0123456789abcdef" for c in prefix.lower()):
            raise LedgerError(f"{prefix!r} is not a sha256 (hex digits)")
        low = prefix.lower()  # a range, not LIKE, so that the index serves it
        matches = [r[0] for r in self.conn.execute(sql + " LIMIT 2", (low, low + "g"))]
        if not matches:
            raise LedgerError(f"nothing in {self.path} matches {prefix!r}")
        if len(matches) > 1:
            raise LedgerError(f"{prefix!r} matches more than one; give more digits")
        return matches[0]
