"""The ledger's judgements of its kept claims, kept at ingest (`JudgedClaims`, the judging half
of `Ledger`, node/ledger.py): each claim judged again from its own looks when one arrives, and
the claims whose counted looks change when a peer a replay contradicted comes into the set of
such peers or leaves it, found by the head of its committee's ranking each claim keeps; and the
claims of a peer that comes into the suspects (`consensus.suspects`) or leaves them.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from node import committees, consensus, evidence
from node.ledger_queries import LOOK_COLUMNS, RESULT_COLUMNS, LedgerQueries


class JudgedClaims(LedgerQueries):
    """Keeps `claims` (each kept claim's judgement) and `ranks` (the head of each one's committee
    ranking) true to the facts, for `Ledger` to call as it stores them."""

    def _judge_claims(self, conn: sqlite3.Connection, ids: Iterable[str] | None = None) -> None:
        """Judge the kept claims `ids` (None: all) again from their looks, under the terms, and
        keep each judgement in `claims`: one claim's looks only, so a look costs its claim alone.
        A peer that a replay of its seed contradicts on any claim is out of every claim
        (`consensus.contradicted`), nor holds a seat on a committee (`committees.panel`): when
        one comes into that set, or leaves it, the claims where that changes which looks count
        are judged again (`_recounted`). Then, when the peers replays caught signing scores no
        run stands behind (`consensus.suspects`) change, their claims are judged again: a
        suspect's claim verifies only once a replay of its own seed backs it."""
        out = self._contradicted(conn)
        caught = out | self._misreporting(conn)
        sql = f"SELECT {RESULT_COLUMNS} FROM results WHERE outcome = 'keep'"
        self._judge(conn, self._kept(sql, ids), out, caught)
        now = self._contradicted(conn)
        if now != out:
            self._judge(conn, self._kept(sql, self._recounted(conn, out, now)), now, caught)
        if (still := now | self._misreporting(conn)) != caught:
            self._judge(conn, self._kept(sql, self._changing(conn, caught, still)), now, still)

    def _changing(
        self, conn: sqlite3.Connection, caught: frozenset[str], still: frozenset[str]
    ) -> set[str]:
        """The claims whose state can change when the suspects go from `caught` to `still`:
        the verified claims of those that came (each now waits for a replay of its seed), the
        open ones of those that left (each may have been waiting)."""
        found: set[str] = set()
        for peers, state in ((still - caught, "verified"), (caught - still, "open")):
            if peers:
                marks = ", ".join("?" * len(peers))
                found.update(row[0] for row in conn.execute(
                    f"SELECT id FROM claims WHERE state = ? AND author IN ({marks})",
                    (state, *sorted(peers)),
                ))  # fmt: skip
        return found

    def _recounted(
        self, conn: sqlite3.Connection, out: frozenset[str], now: frozenset[str]
    ) -> set[str]:
        """The claims whose counted looks change when the contradicted peers go from `out` to
        `now`, to be judged again: in an open campaign, those the peers that came or left looked
        at; with members, those where a seat changes hands and a peer on either side looked.
        Each claim keeps the head of its committee's ranking, contradicted members and all
        (`ranks`), so the seats before and after are found in it without drawing any committee
        again, and nothing is written where no look changes sides. A head left with fewer than a
        committee of members not contradicted is drawn deeper as its claim is judged again."""
        if (self.terms() or {}).get("members") is None:  # open: every look counts, no seats
            marks = ", ".join("?" * len(now ^ out))
            return {row[0] for row in conn.execute(
                f"SELECT DISTINCT result FROM verifications WHERE author IN ({marks}) "
                f"AND result IN (SELECT id FROM claims)", sorted(now ^ out),
            )}  # fmt: skip
        # A peer sits on a committee only within the first `size` + (peers out) in rank: one
        # that comes into the set can leave a seat only where it ranks within `size` +
        # len(out), one that leaves it can take one only within `size` + len(now); the heads
        # are read that far.
        came, left = sorted(now - out), sorted(out - now)
        size, moved, again = self._committee_size(), [], set()
        deep, heads = size + max(len(out), len(now)), {}
        for cid, member in conn.execute(
            f"SELECT claim, member FROM ranks WHERE rank < ? AND claim IN ("
            f"SELECT claim FROM ranks WHERE member IN ({', '.join('?' * len(came))}) AND rank < ? "
            f"UNION SELECT claim FROM ranks WHERE member IN ({', '.join('?' * len(left))}) "
            f"AND rank < ?) ORDER BY claim, rank",
            [deep, *came, size + len(out), *left, size + len(now)],
        ):  # fmt: skip
            heads.setdefault(cid, []).append(member)
        for cid, head in heads.items():
            if not committees.holds(head, None, now, size):
                again.add(cid)
                continue
            was, seats = committees.seated(head, out, size), committees.seated(head, now, size)
            moved += [(cid, peer) for peer in set(was) ^ set(seats)]
        return again | self._looked(conn, moved)

    def _heads(self, conn: sqlite3.Connection, ids: list[str]) -> dict[str, list[str]]:
        """{claim id: the head of its ranking it keeps}, for the claims `ids`."""
        found: dict[str, list[str]] = {}
        for marks, part in _in_parts(ids):
            for cid, member in conn.execute(
                f"SELECT claim, member FROM ranks WHERE claim IN ({marks}) ORDER BY claim, rank",
                part,
            ):  # fmt: skip
                found.setdefault(cid, []).append(member)
        return found

    def _committee_size(self) -> int:
        """The committees' size: the campaign's, the same on every profile (`Rules`)."""
        return consensus.Rules(self.quorum()).committee_size

    def _looked(self, conn: sqlite3.Connection, pairs: list[tuple[str, str]]) -> set[str]:
        """The claims of `pairs` (claim id, peer) that their peer looked at."""
        found: set[str] = set()
        for at in range(0, len(pairs), 250):
            part = pairs[at : at + 250]
            values = ", ".join(["(?, ?)"] * len(part))
            found.update(row[0] for row in conn.execute(
                f"SELECT v.result FROM (VALUES {values}) AS p "
                f"JOIN verifications AS v ON v.author = p.column2 AND v.result = p.column1",
                [x for pair in part for x in pair],
            ))  # fmt: skip
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

    def overclaimed(self, profile: str) -> frozenset[str]:
        """The authors whose own claimed gain lay far above what the looks at one of their
        claims on `profile` found (`Judgement.author_z` past `evidence.OUTLIER_Z`): numbers of
        theirs nobody looked at are not taken at their word."""
        if self.schema_version < 3:
            return frozenset()
        return frozenset(
            r["author"] for r in self.rows(
                "SELECT DISTINCT author FROM claims WHERE profile = ? AND author_z > ?",
                (profile, evidence.OUTLIER_Z),
            )
        )  # fmt: skip

    def suspects(self) -> frozenset[str]:
        """The peers replays caught signing scores no run stands behind (`consensus.suspects`):
        their claims verify only once a replay of their own seed backs them. None before the
        ledger kept judgements (schema 3)."""
        return self._suspects(self.conn) if self.schema_version >= 3 else frozenset()

    def _contradicted(self, conn: sqlite3.Connection) -> frozenset[str]:
        rows = conn.execute(
            "SELECT contradicted FROM claims WHERE contradicted IS NOT NULL"
        ).fetchall()
        return frozenset(peer for (text,) in rows for peer in json.loads(text))

    def _suspects(self, conn: sqlite3.Connection) -> frozenset[str]:
        return self._contradicted(conn) | self._misreporting(conn)

    def _misreporting(self, conn: sqlite3.Connection) -> frozenset[str]:
        """The authors of claims found misreported (`consensus.suspects`)."""
        rows = conn.execute("SELECT DISTINCT author FROM claims WHERE state = 'misreported'")
        return frozenset(author for (author,) in rows)

    def _judge(
        self, conn: sqlite3.Connection, claims: Iterable[Mapping[str, Any]], out: frozenset[str],
        caught: frozenset[str],
    ) -> None:  # fmt: skip
        rules, heads = functools.cache(self.rules), []
        for claim in claims:
            looks = self.rows(
                f"SELECT {LOOK_COLUMNS} FROM verifications WHERE result = ?", (claim["id"],)
            )
            r = rules(claim["profile"])
            order = committees.ranking(claim, r)
            j = consensus.judge_claim(claim, looks, r, out, order, caught)
            conn.execute(
                "INSERT OR REPLACE INTO claims VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (claim["id"], claim["profile"], claim["harness"], claim["parent"], claim["child"],
                 claim["author"], j.state, j.gain, j.se, j.seeds, j.sigma, json.dumps(j.peers),
                 json.dumps(j.outliers), int(j.disputed), j.author_z, j.reason,
                 json.dumps(j.contradicted) if j.contradicted else None,
                 json.dumps(j.misreported_by) if j.misreported_by else None,
                 int(j.awaits_replay)),
            )  # fmt: skip
            heads.append((claim["id"], order, r.committee_size))
        self._keep_heads(conn, heads, out)

    def _keep_heads(
        self, conn: sqlite3.Connection,
        heads: list[tuple[str, tuple[str, ...] | None, int]], out: frozenset[str],
    ) -> None:  # fmt: skip
        """Keep in `ranks` the head of each claim's ranking, `heads` as (claim id, its ranking,
        None in an open campaign, its committee's size): the one kept stays while it is that
        ranking's head and still finds the committee (`committees.holds`), else the head for
        the peers `out` now (`committees.kept_head`) replaces it."""
        kept, fresh = self._heads(conn, [cid for cid, _, _ in heads]), []
        for cid, order, size in heads:
            if order is None:  # an open campaign: no committee, no head
                if cid in kept:
                    fresh.append((cid, ()))
            elif cid not in kept or not committees.holds(kept[cid], order, out, size):
                fresh.append((cid, committees.kept_head(order, out, size)))
        conn.executemany("DELETE FROM ranks WHERE claim = ?", [(cid,) for cid, _ in fresh])
        conn.executemany("INSERT INTO ranks VALUES (?, ?, ?)",
                         [(m, cid, k) for cid, head in fresh for k, m in enumerate(head)])  # fmt: skip


def _in_parts(ids: list[str], size: int = 500) -> Iterator[tuple[str, tuple[str, ...]]]:
    """`ids` in parts of `size` (SQLite's bound on parameters), each with its placeholders."""
    for at in range(0, len(ids), size):
        part = tuple(ids[at : at + size])
        yield ", ".join("?" * len(part)), part
