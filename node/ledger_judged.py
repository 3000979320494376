"""The ledger's judgements of its kept claims, kept at ingest (`JudgedClaims`, the judging half
of `Ledger`, node/ledger.py): each claim judged again from its own looks when one arrives, and
the claims whose counted looks change when a peer a replay contradicted comes into the set of
such peers or leaves it, found by the committee seats each claim keeps.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from node import committees, consensus
from node.ledger_queries import LOOK_COLUMNS, RESULT_COLUMNS, LedgerQueries


class JudgedClaims(LedgerQueries):
    """Keeps `claims` (each kept claim's judgement, its committee's seats and reserve) and
    `seats` (who sits where) true to the facts, for `Ledger` to call as it stores them."""

    def _judge_claims(self, conn: sqlite3.Connection, ids: Iterable[str] | None = None) -> None:
        """Judge the kept claims `ids` (None: all) again from their looks, under the terms, and
        keep each judgement in `claims`: one claim's looks only, so a look costs its claim alone.
        A peer that a replay of its seed contradicts on any claim is out of every claim
        (`consensus.contradicted`), nor holds a seat on a committee (`committees.panel`): when
        one comes into that set, or leaves it, the claims where that changes which looks count
        are judged again (`_recounted`)."""
        out = self._contradicted(conn)
        sql = f"SELECT {RESULT_COLUMNS} FROM results WHERE outcome = 'keep'"
        self._judge(conn, self._kept(sql, ids), out)
        now = self._contradicted(conn)
        if now != out:
            self._judge(conn, self._kept(sql, self._recounted(conn, out, now)), now)

    def _recounted(
        self, conn: sqlite3.Connection, out: frozenset[str], now: frozenset[str]
    ) -> set[str]:
        """The claims whose counted looks change when the contradicted peers go from `out` to
        `now`, to be judged again: in an open campaign, those the peers that came or left looked
        at; with members, those where a seat changes hands and a peer on either side looked.
        Each claim keeps its seats and the next members in rank, its reserve: a contradicted
        member's seat goes to the first in the reserve, and a peer back in the set takes back
        its rank (`committees.moved`, `committees.returned`), without drawing every claim's
        committee again. Where no look changes sides, the seats change hands in place."""
        came, left = sorted(now - out), sorted(out - now)
        marks = ", ".join("?" * len(came + left))
        again = {row[0] for row in conn.execute(
            f"SELECT DISTINCT result FROM verifications JOIN claims ON claims.id = result "
            f"WHERE verifications.author IN ({marks}) AND claims.seats IS NULL", came + left,
        )}  # fmt: skip
        if left:  # a peer back may take a seat on any committee
            rows = self.rows(
                "SELECT claims.id, claims.author, claims.parent, time, claims.profile, "
                "claims.seats, reserve FROM claims JOIN results USING (id) "
                "WHERE claims.seats IS NOT NULL"
            )
        else:
            marks = ", ".join("?" * len(came))
            rows = self.rows(
                f"SELECT id, seats, reserve FROM claims WHERE id IN "
                f"(SELECT claim FROM seats WHERE member IN ({marks}))", came,
            )  # fmt: skip
        rules, was, drawn = functools.cache(self.rules), {}, {}
        for c in rows:
            seats, reserve = json.loads(c["seats"]), json.loads(c["reserve"] or "[]")
            now_drawn = committees.moved(seats, reserve, now)
            if now_drawn is None:
                again.add(c["id"])
                continue
            if left:
                now_drawn = committees.returned(c, rules(c["profile"]), *now_drawn, left)
            if now_drawn != (seats, reserve):
                was[c["id"]], drawn[c["id"]] = set(seats), now_drawn
        lookers = self._lookers(conn, [cid for cid in drawn if set(drawn[cid][0]) != was[cid]])
        for cid in list(drawn):
            if (set(drawn[cid][0]) ^ was[cid]) & lookers.get(cid, set()):
                again.add(cid)
                del drawn[cid]
        conn.executemany("UPDATE claims SET seats = ?, reserve = ? WHERE id = ?",
                         [(json.dumps(s), json.dumps(r), cid) for cid, (s, r) in drawn.items()])  # fmt: skip
        self._seated(conn, [(cid, was[cid], seats) for cid, (seats, _) in drawn.items()])
        return again

    def _lookers(self, conn: sqlite3.Connection, ids: list[str]) -> dict[str, set[str]]:
        """{claim id: the peers that looked at it}, for the claims `ids`."""
        found: dict[str, set[str]] = {}
        for marks, part in _in_parts(ids):
            sql = f"SELECT result, author FROM verifications WHERE result IN ({marks})"
            for cid, who in conn.execute(sql, part):
                found.setdefault(cid, set()).add(who)
        return found

    def _kept(self, sql: str, ids: Iterable[str] | None) -> list[dict[str, Any]]:
        """The rows of `sql` (kept results), those of `ids` alone unless None."""
        if ids is None:
            return self.rows(sql)
        return [row for marks, part in _in_parts(list(ids))
                for row in self.rows(f"{sql} AND id IN ({marks})", part)]  # fmt: skip

    def contradicted(self) -> frozenset[str]:
        """The peers a replay contradicted on some claim (`consensus.contradicted`): their looks
        count on no claim, and their seats on committees go to the next in rank."""
        return self._contradicted(self.conn)

    def _contradicted(self, conn: sqlite3.Connection) -> frozenset[str]:
        rows = conn.execute(
            "SELECT contradicted FROM claims WHERE contradicted IS NOT NULL"
        ).fetchall()
        return frozenset(peer for (text,) in rows for peer in json.loads(text))

    def _judge(
        self, conn: sqlite3.Connection, claims: Iterable[Mapping[str, Any]], out: frozenset[str]
    ) -> None:
        rules, seated = functools.cache(self.rules), []
        for claim in claims:
            looks = self.rows(
                f"SELECT {LOOK_COLUMNS} FROM verifications WHERE result = ?", (claim["id"],)
            )
            j = consensus.judge_claim(claim, looks, rules(claim["profile"]), out)
            conn.execute(
                "INSERT OR REPLACE INTO claims VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (claim["id"], claim["profile"], claim["harness"], claim["parent"], claim["child"],
                 claim["author"], j.state, j.gain, j.se, j.seeds, j.sigma, json.dumps(j.peers),
                 json.dumps(j.outliers), int(j.disputed), j.author_z, j.reason,
                 json.dumps(j.contradicted) if j.contradicted else None,
                 None if j.seats is None else json.dumps(j.seats), json.dumps(j.reserve)),
            )  # fmt: skip
            seated.append((claim["id"], None, j.seats or ()))
        self._seated(conn, seated)

    def _seated(
        self, conn: sqlite3.Connection,
        changes: Iterable[tuple[str, Collection[str] | None, Collection[str]]],
    ) -> None:  # fmt: skip
        """Keep `seats` (who sits where) to the claims' committees, `changes` as (claim id, its
        seats before, None where they are not known, its seats now)."""
        changes = list(changes)
        conn.executemany("DELETE FROM seats WHERE claim = ?",
                         [(cid,) for cid, was, _ in changes if was is None])  # fmt: skip
        conn.executemany("DELETE FROM seats WHERE member = ? AND claim = ?",
                         [(m, cid) for cid, was, now in changes if was is not None
                          for m in set(was) - set(now)])  # fmt: skip
        conn.executemany("INSERT INTO seats VALUES (?, ?)",
                         [(m, cid) for cid, was, now in changes
                          for m in set(now) - set(was or ())])  # fmt: skip


def _in_parts(ids: list[str], size: int = 500) -> Iterator[tuple[str, tuple[str, ...]]]:
    """`ids` in parts of `size` (SQLite's bound on parameters), each with its placeholders."""
    for at in range(0, len(ids), size):
        part = tuple(ids[at : at + size])
        yield ", ".join("?" * len(part)), part
