"""The report's page: one self-contained HTML file. Every text that comes from a fact reaches
it escaped: descriptions are written by peers, and a peer may be hostile."""

from __future__ import annotations

import base64
import html
from collections import Counter

from node import consensus, evidence, margins
from node.readable import bpb as _bpb
from node.readable import count
from node.readable import peer as short_peer
from node.readable import when as _when
from node.report.reading import Snapshot
from node.safe_text import safe_text


def _e(value: object, keep: str = "") -> str:
    """Escaped for HTML text and attribute values: nothing from a fact is ever markup, and its
    control and bidi characters are shown as escapes (`safe_text`), never acted on."""
    return html.escape(safe_text(value, markup=False, keep=keep), quote=True)


def _peer(peer_id: str | None) -> str:
    if not peer_id:
        return "-"
    return f'<span class="peer" title="{_e(peer_id)}">{_e(short_peer(peer_id))}</span>'


def _table(table_id: str, header: list[str], rows: list[list[str]]) -> str:
    """Cells arrive escaped (or built from escaped parts) by the caller."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{_e(table_id)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _diff_html(diff: str) -> str:
    if not diff:
        return '<span class="muted">no change in train.py</span>'
    lines = []
    for line in diff.splitlines():
        kind = "add" if line.startswith("+") else "del" if line.startswith("-") else ""
        kind = "hunk" if line.startswith("@@") else "" if line.startswith(("+++", "---")) else kind
        shown = _e(line, keep="\t")  # a tab in a diff is the code's own
        lines.append(f'<span class="{kind}">{shown}</span>' if kind else shown)
    return "<pre>" + "\n".join(lines) + "</pre>"


def _leaderboard(snap: Snapshot) -> str:
    held = _held(snap)
    if not snap.board:
        return f"<p>No version is verified yet (quorum {snap.quorum}).</p>" + held
    out = []
    for profile, rows in snap.board.items():
        out.append(f"<h3>profile {_e(profile)}</h3>")
        out.append(_table(f"leaderboard-{profile}",
                          ["#", "score", "gain", "version", "found by", "verified by", "description"],
                          [[str(rank), f"{r['score']:+.4f} &plusmn; {r['se']:.4f}",
                            f"{r['gain']:.4f} ({r['seeds']} seeds)", f"<code>{_e(r['child'][:12])}</code>",
                            _peer(r["found_by"]), ", ".join(_peer(p) for p in r["verified_by"]),
                            _e(r["description"])]
                           for rank, r in enumerate(rows, 1)]))  # fmt: skip
    return "".join(out) + held


def _held(snap: Snapshot) -> str:
    """The claims held as outliers: nobody builds on them until they have more looks."""
    rows = [r for r in snap.results if r["id"] in snap.held]
    if not rows:
        return ""
    return "<h3>Held for more looks</h3>" + _table(
        "held", ["profile", "val_bpb", "version", "found by", "why", "description"],
        [[_e(r["profile"]), _bpb(r["val_bpb"]), f"<code>{_e(r['child'][:12])}</code>",
          _peer(r["author"]), _e(snap.held[r["id"]]), _e(r["description"])]
         for r in sorted(rows, key=lambda r: (r["profile"], r["val_bpb"], r["id"]))],
    )  # fmt: skip


def _lineages(snap: Snapshot) -> str:
    if not snap.lineages:
        return "<p>No verified version yet, so no lineage to show.</p>"
    out = []
    for profile, steps in snap.lineages.items():
        root = steps[0]["parent"]
        origin = "the baseline" if root in snap.baselines else f"<code>{_e(root[:12])}</code>"
        out.append(f"<h3>profile {_e(profile)}: <code>{_e(steps[-1]['child'][:12])}</code>, "
                   f"{count(len(steps), 'step')} from {origin}</h3>")  # fmt: skip
        out.append(f'<ol class="lineage" id="lineage-{_e(profile)}">')
        for s in steps:
            if s["diff"] is not None:
                diff = f"<details><summary>diff ({s['diff_size']} B)</summary>{_diff_html(s['diff'])}</details>"
            else:
                diff = f'<p class="muted">diff not held: this ledger lacks the {" and the ".join(s["missing"])} version</p>'
            out.append(
                f"<li><code>{_e(s['child'][:12])}</code> val_bpb {_bpb(s['val_bpb'])} "
                f"(delta {_bpb(s['delta'], True)}, verified delta {_bpb(s['verified_delta'], True)}, "
                f"{count(s['confirmations'], 'confirmation')}) by "
                f"{_peer(s['author'])} at {_when(s['time'])}: "
                f'<span class="description">{_e(s["description"])}</span>{diff}</li>'
            )  # fmt: skip
        out.append("</ol>")
    return "".join(out)


def _peers(snap: Snapshot) -> str:
    if not snap.peers:
        return "<p>No peer has published anything yet.</p>"
    header = ["", "peer", "experiments", "kept", "discarded", "crashed", "void",
              "claims verified", "claims refuted", "verifications made"]  # fmt: skip
    rows = [
        [f'<span class="swatch" style="background:{snap.colours[p["peer_id"]]}"></span>',
         f"<code>{_e(p['peer_id'])}</code>", *(str(p[k]) for k in (
             "experiments", "keep", "discard", "crash", "void", "verified", "refuted",
             "verifications"))]
        for p in snap.peers
    ]  # fmt: skip
    return _table("peers", header, rows)


def _noise(snap: Snapshot) -> str:
    if not snap.noise:
        return "<p>Not measured yet: this node has made no runs.</p>"
    rows = []
    for profile, pairs in snap.noise.items():
        diffs = sum(len(d) for d in pairs.values())
        sigma, df = margins.paired_noise(pairs, prior=0.0, prior_df=0)
        if df:
            margin = margins.margin_for(sigma)
            shown = (f"{sigma:.4f} bpb over {df} degrees of freedom; margin {margin:.4f} "
                     f"({margins.DEFAULT_K:g} standard deviations, at least "
                     f"{margins.DEFAULT_FLOOR:g})")  # fmt: skip
        else:
            shown = "not measured yet: no pair ran on two seeds (the profile's prior is in use)"
        rows.append([_e(profile), str(len(pairs)), str(diffs), shown])
    return _table(
        "noise", ["profile", "pairs", "paired runs", "spread of a paired difference"], rows
    )


CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em;
       color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td { overflow-wrap: anywhere; }
img.plot { max-width: 100%; border: 1px solid #eee; }
pre { background: #f8f8f8; padding: 0.6em; overflow-x: auto; font-size: 12px; }
.add { color: #116329; background: #e6ffec; } .del { color: #82071e; background: #ffebe9; }
.hunk { color: #6639ba; } .muted { color: #777; }
.peer, code { white-space: nowrap; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; border-radius: 50%; }
.lineage li { margin-bottom: 0.6em; }
"""


def render_html(snap: Snapshot, png: bytes) -> str:
    """The page: plain HTML and inline CSS, the plot inside as a data URI; nothing to fetch."""
    counts = Counter(r["outcome"] for r in snap.results)
    if snap.results:
        summary = (f"<p id=\"summary\">{count(len(snap.results), 'experiment')} by "
                   f"{count(len(snap.peers), 'peer')}: {counts['keep']} kept, "
                   f"{counts['discard']} discarded, {counts['crash']} crashed, "
                   f"{counts['void']} void; {count(len(snap.verified), 'verified win')}, "
                   f"{count(len(snap.refuted), 'refuted claim')} (quorum {snap.quorum})"
                   f"{f'; {len(snap.held)} held for more looks' if snap.held else ''}.</p>")  # fmt: skip
    else:
        summary = '<p id="summary">Nothing was tried yet: this ledger holds no experiment.</p>'
    image = base64.b64encode(png).decode()
    campaign = ", ".join(_e(c) for c in snap.campaigns) or "-"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>research-swarm report</title>
<style>{CSS}</style></head>
<body>
<h1>research-swarm report</h1>
<p class="muted">Ledger <code>{_e(snap.path)}</code>, read at
<span id="read-at">{_when(snap.read_at)}</span>. Campaign: {campaign}.</p>
{summary}
<img class="plot" alt="val_bpb per experiment over time, with the baseline and the head" src="data:image/png;base64,{image}">
<h2>Leaderboard</h2>
<p>The best versions per profile, reached from the baseline through verified claims. A version's
score is its parent's minus the gain its verifiers measured (bpb, from the baseline at 0: lower is
better); the gain pools every look by peers other than the author, with the same harness, and is
verified by a sequential test that a change of no gain passes at most
{evidence.ALPHA:.0%} of the time, with the {snap.quorum - 1} most favourable verifier(s) left out.
A claimed val_bpb ranks nothing. A claim whose gain lies far beyond any verified on its profile is
held until {consensus.HOLD_LOOKS} seeds stand behind it.</p>
{_leaderboard(snap)}
<h2>Lineage of the best version</h2>
{_lineages(snap)}
<h2>Peers</h2>
{_peers(snap)}
<h2>Noise margin</h2>
<p>A node keeps a change, or confirms a peer's, only when it beats its parent by more than this
margin, measured from the node's own repeated runs of the baseline.</p>
{_noise(snap)}
</body></html>
"""
