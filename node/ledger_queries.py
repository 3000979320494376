"""What a ledger answers: the read-only questions of `swarm ledger`, the report and the head.

`LedgerQueries` is half of `Ledger` (node/ledger.py): it reads the derived tables and never
writes. Queries that walk long lists read them a page at a time.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack

from node import consensus, wire
from node.errors import SwarmError

MAX_LINEAGE = 10_000  # steps walked back before giving up (parent links may loop)
_PAGE = 500  # rows per query where a query walks a long list


class LedgerError(SwarmError):
    """A ledger file that is missing, not a ledger, too new, or a query about something absent."""


class LedgerQueries:
    """The read-only questions a `Ledger` answers (it provides `conn`, `path` and `rows`)."""

    conn: sqlite3.Connection
    path: Path
    schema_version: int

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict]:
        cur = self.conn.execute(sql, tuple(params))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def paired_differences(
        self, profile: str, harness: str | None = None
    ) -> dict[tuple[str, str], list[float]]:
        """{(parent, child): child minus parent on each seed} over this node's own paired runs
        on `profile` (its experiments, verifications and replays): a child's run and a run of
        its parent on the same seed, profile and harness (None: its latest run's harness)."""
        if harness is None:
            latest = self.rows(
                "SELECT harness FROM runs WHERE profile = ? AND harness IS NOT NULL "
                "ORDER BY id DESC LIMIT 1",
                (profile,),
            )
            if not latest:
                return {}
            harness = latest[0]["harness"]
        rows = self.rows(
            "SELECT c.parent, c.child, c.seed, AVG(c.val_bpb) - AVG(p.val_bpb) AS diff "
            "FROM runs c JOIN runs p ON p.child = c.parent AND p.parent = p.child "
            "AND p.seed = c.seed AND p.profile = c.profile AND p.harness = c.harness "
            "AND p.val_bpb IS NOT NULL WHERE c.parent != c.child AND c.profile = ? "
            "AND c.harness = ? AND c.val_bpb IS NOT NULL GROUP BY c.parent, c.child, c.seed",
            (profile, harness),
        )
        pairs: dict[tuple[str, str], list[float]] = {}
        for r in rows:
            pairs.setdefault((r["parent"], r["child"]), []).append(r["diff"])
        return pairs

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

    def experiments(
        self, peer: str | None = None, outcome: str | None = None, profile: str | None = None,
        limit: int = 50, quorum: int = 1,
    ) -> list[dict]:  # fmt: skip
        """Results, newest first, with how many peers confirmed, refuted, could not tell
        (inconclusive) and found void each, and why a claim is held for more looks (`held`:
        None when it is not; see `consensus.held_claims`, under `quorum`).

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
        claimed = {r["profile"] for r in rows if r["outcome"] == "keep" and r["confirmations"]}
        held = self.held_claims(quorum, sorted(claimed))
        for r in rows:
            r["held"] = held.get(r["id"])
        return rows

    def _confirmed(self, profile: str) -> tuple[list[dict], list[dict]]:
        """The kept results of `profile` that some peer confirmed, and the verdicts on them that
        `consensus` weighs: only those can be verified or held, so the rule over them is the
        rule over every fact of the profile."""
        results = self.rows(
            "SELECT id, author, time, profile, parent, child, harness, val_bpb, description "
            "FROM results r WHERE outcome = 'keep' AND profile = ? AND val_bpb IS NOT NULL "
            "AND EXISTS (SELECT 1 FROM verifications v WHERE v.result = r.id "
            "AND v.verdict = 'confirm')",
            (profile,),
        )
        verdicts = self.rows(
            "SELECT v.result, v.author, v.verdict, v.profile, v.harness, v.delta, v.seed "
            "FROM verifications v JOIN results r ON r.id = v.result WHERE r.outcome = 'keep' "
            "AND r.profile = ? AND v.verdict IN ('confirm', 'refute', 'void')",
            (profile,),
        )
        return results, verdicts

    def _profiles(self) -> list[str]:
        rows = self.conn.execute(
            "SELECT DISTINCT profile FROM results WHERE outcome = 'keep' ORDER BY profile"
        )
        return [profile for (profile,) in rows.fetchall()]

    def held_claims(self, quorum: int = 1, profiles: Iterable[str] | None = None) -> dict[str, str]:
        """{result id: why it is held}: claims held as outliers for more looks, on `profiles`
        (default: all)."""
        held: dict[str, str] = {}
        for profile in self._profiles() if profiles is None else profiles:
            held.update(consensus.held_claims(*self._confirmed(profile), quorum))
        return held

    def held(self, quorum: int = 1) -> dict[str, list[dict]]:
        """Per profile, the claims held as outliers (lowest claimed val_bpb first), each with why."""
        out: dict[str, list[dict]] = {}
        for profile in self._profiles():
            results, verdicts = self._confirmed(profile)
            reasons = consensus.held_claims(results, verdicts, quorum)
            rows = sorted((r for r in results if r["id"] in reasons),
                          key=lambda r: (r["val_bpb"], r["child"], r["id"]))  # fmt: skip
            if rows:
                out[profile] = [{**r, "reason": reasons[r["id"]]} for r in rows]
        return out

    def leaderboard(self, quorum: int = 1, limit: int = 10) -> dict[str, list[dict]]:
        """Per profile, the best verified train.py versions, lowest val_bpb first (ties by hash).

        Reads each profile's confirmed claims and their verdicts: whether a claim is verified
        depends on the gains of every other verified claim of its profile (the outlier hold,
        `consensus.held_claims`), so the cost follows the confirmed claims, not every result.
        """
        board: dict[str, list[dict]] = {}
        for profile in self._profiles():
            results, verdicts = self._confirmed(profile)
            verified = consensus.verified_children(results, verdicts, quorum)
            chosen: list[str] = []
            for r in sorted(results, key=lambda r: (r["val_bpb"], r["child"], r["id"])):
                if r["id"] in verified and r["child"] not in chosen and len(chosen) < limit:
                    chosen.append(r["child"])
            if not chosen:
                continue
            # Every verified result of the chosen versions: who found each first, who verified it.
            entries: dict[str, dict] = {}
            for r in sorted(results, key=lambda r: (r["time"], r["id"])):
                if r["id"] not in verified or r["child"] not in chosen:
                    continue
                entry = entries.setdefault(
                    r["child"],
                    {**r, "found_by": r["author"], "verified_by": set(), "result": r["id"]},
                )
                entry["val_bpb"] = min(entry["val_bpb"], r["val_bpb"])
                entry["verified_by"] |= verified[r["id"]]
            board[profile] = []
            for child in chosen:
                entry = entries[child]
                entry["verified_by"] = sorted(entry["verified_by"])
                for drop in ("author", "id", "harness"):
                    entry.pop(drop)
                board[profile].append(entry)
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
        """Every peer seen: facts, results, confirmations, refutations and voids its results
        received, and the messages rejected from it by reason."""
        # CROSS JOIN keeps SQLite walking verifications (fewer) rather than every result.
        standing = {
            r["author"]: r
            for r in self.rows(
                "SELECT r.author, SUM(v.verdict = 'confirm') AS confirmations, "
                "SUM(v.verdict = 'refute') AS refutations, SUM(v.verdict = 'void') AS voids "
                "FROM verifications v CROSS "
                "JOIN results r ON r.id = v.result AND v.author != r.author GROUP BY r.author"
            )
        }
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
            p["confirmations"] = s.get("confirmations") or 0
            p["refutations"] = s.get("refutations") or 0
            p["voids"] = s.get("voids") or 0
            p["rejected"] = rejected.pop(p["peer_id"], {})
            out.append(p)
        for peer, reasons in rejected.items():  # peers only ever heard from with junk
            out.append({"peer_id": peer, "first_seen": None, "last_seen": None, "facts": 0,
                        "results": 0, "verifications": 0, "confirmations": 0, "refutations": 0,
                        "voids": 0, "rejected": reasons})  # fmt: skip
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
