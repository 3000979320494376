"""A node's paired noise: the standard deviation of one paired difference (a child's val_bpb
minus its parent's on one seed) on its class of device, which its keep margin is made of.

It comes from the profile's measured prior, moved by the node's own pairs measured on two seeds
or more, and by its peers' looks: looks are made whatever they find, so the spread of one
claim's looks on different seeds, by peers of one device class, is that class's noise. A node in
a swarm learns its noise from them without a run of its own (`node.agent.researcher`).
"""

from __future__ import annotations

from node import margins
from node.ledger import Ledger


def own_pairs(
    ledger: Ledger, profile: str, harness: str | None = None
) -> dict[tuple[str, str], list[float]]:
    """{(parent, child): child minus parent on each seed} over this node's own paired runs on
    `profile` (its experiments, verifications and replays): a child's run and a run of its parent
    on the same seed, profile and harness (None: its latest run's harness). A pair with a run made
    only because its first seed looked like a win is left out: the spread of such pairs
    overstates the noise (the first seed was chosen for its luck)."""
    if harness is None:
        harness = _latest(ledger, profile, "harness")
        if harness is None:
            return {}
    rows = ledger.rows(
        "SELECT c.parent, c.child, c.seed, AVG(c.val_bpb) - AVG(p.val_bpb) AS diff "
        "FROM runs c JOIN runs p ON p.child = c.parent AND p.parent = p.child "
        "AND p.seed = c.seed AND p.profile = c.profile AND p.harness = c.harness "
        "AND p.val_bpb IS NOT NULL WHERE c.parent != c.child AND c.profile = ? "
        "AND c.harness = ? AND c.val_bpb IS NOT NULL AND NOT EXISTS (SELECT 1 FROM runs s "
        "WHERE s.parent = c.parent AND s.child = c.child AND s.selected = 1) "
        "GROUP BY c.parent, c.child, c.seed",
        (profile, harness),
    )
    pairs: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        pairs.setdefault((r["parent"], r["child"]), []).append(r["diff"])
    return pairs


def look_pairs(ledger: Ledger, profile: str, harness: str, device: str) -> dict[str, list[float]]:
    """{claim: child minus parent on each seed} over every peer's looks at claims on `profile`
    under `harness`, by peers of `device`'s class. Looks on one seed (a seed's replays) count
    once, as their mean: they share that seed's luck. Looks by a peer the ledger caught
    signing numbers off (a replay contradicted it, or it claimed far more than the looks at
    its claim found) are left out: a liar's few looks would raise every node's noise, and
    with it every margin, until no real win is kept."""
    off = sorted(ledger.contradicted() | ledger.overclaimed(profile))
    rows = ledger.rows(
        "SELECT result, AVG(delta) AS diff FROM verifications WHERE profile = ? AND harness = ? "
        "AND device = ? AND delta IS NOT NULL AND seed IS NOT NULL "
        f"AND author NOT IN ({', '.join('?' * len(off))}) GROUP BY result, seed",
        (profile, harness, device, *off),
    )
    looks: dict[str, list[float]] = {}
    for r in rows:
        looks.setdefault(r["result"], []).append(r["diff"])
    return looks


def device_of(ledger: Ledger, profile: str) -> str:
    """This node's device class, as its latest run on the profile recorded it ("": no run)."""
    return _latest(ledger, profile, "device") or ""


def estimate(ledger: Ledger, profile: str, prior: float, harness: str) -> tuple[float, int]:
    """(the paired noise of this node's device class on `profile` under `harness`, its degrees
    of freedom): `prior` moved by its own pairs and its class's looks."""
    pairs: dict = dict(own_pairs(ledger, profile, harness))
    device = device_of(ledger, profile)
    if device:
        pairs |= look_pairs(ledger, profile, harness, device)
    return margins.paired_noise(pairs, prior)


def _latest(ledger: Ledger, profile: str, column: str) -> str | None:
    rows = ledger.rows(
        f"SELECT {column} FROM runs WHERE profile = ? AND {column} IS NOT NULL "
        "ORDER BY id DESC LIMIT 1",
        (profile,),
    )
    return rows[0][column] if rows else None
