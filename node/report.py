"""`swarm report`: what a node's ledger says the swarm has tried, as a picture and one web page.

It reads the ledger read-only and writes `report.png` (val_bpb per experiment over time, with
the baseline and the swarm's head as lines) and `report.html` (self-contained: leaderboard,
lineage of the best version with its diffs, peers, noise margin). It never writes to the ledger, and every text that comes from a fact reaches the
page escaped: descriptions are written by peers, and a peer may be hostile.
"""

from __future__ import annotations

import base64
import difflib
import html
import io
import os
import statistics
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from node import consensus, evidence
from node.errors import SwarmError
from node.home import resolve_home
from node.ledger import MIGRATIONS, Ledger, LedgerError, ledger_path
from node.ledger_queries import LOOK_COLUMNS
from node.readable import bpb as _bpb
from node.readable import peer as short_peer
from node.readable import when as _when
from node.safe_text import safe_text

PNG_FILE, HTML_FILE = "report.png", "report.html"
BOARD_LIMIT = 10  # versions shown per profile on the leaderboard
COLOURED_PEERS = 10  # the most active peers get a colour each; the rest share grey
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#393b79"]  # fmt: skip
OTHER_COLOUR = "#b0b0b0"
HEAD_POINTS = 200  # looks at which the head is judged again for the plot, at most, per profile
EXTRA = "pip install 'research-swarm[report]'"


class ReportError(SwarmError):
    """A report that cannot be written: no ledger, not a ledger, an output folder not writable."""


@dataclass
class Snapshot:
    """Everything the report shows, read from the ledger in one go."""

    path: str
    read_at: int  # ms since the epoch
    campaigns: list[str]
    quorum: int
    results: list[dict]  # every result, oldest first
    verified: dict[str, set[str]]  # result id -> the peers whose confirmations count
    refuted: set[str]  # result ids refuted by the quorum
    held: dict[str, str]  # result id -> why it is held as an outlier for more looks
    board: dict[str, list[dict]]  # ledger.leaderboard
    lineages: dict[str, list[dict]]  # profile -> steps to its best version, each with "diff"
    baselines: set[str]
    peers: list[dict]
    noise: dict[str, dict[tuple[str, str], list[float]]]  # profile -> its paired differences
    colours: dict[str, str]  # peer id -> colour in the plot and the peer table
    baseline_bpb: dict[str, float]  # profile -> the baseline's measured val_bpb (its median)
    heads: dict[str, list[tuple[int, float]]]  # profile -> (time, the head's score) as it moved


# ---------------------------------------------------------------- reading the ledger


def open_ledger(home: Path | None, db: Path | None) -> Ledger:
    """The ledger at `db`, else in `home`, opened read-only; a ReportError when there is none."""
    path = db if db is not None else ledger_path(resolve_home(home, create=False))
    if not path.is_file():
        hint = "" if db is not None else " (no facts yet: run a node, or pass --db)"
        raise ReportError(f"no ledger at {path}{hint}")
    try:
        ledger = Ledger(path, readonly=True)
    except LedgerError as exc:
        raise ReportError(str(exc)) from None
    if ledger.schema_version < len(MIGRATIONS):  # read-only, it cannot be upgraded here
        ledger.close()
        raise ReportError(f"{path} is a ledger of schema {ledger.schema_version}, older than this "
                          f"version's {len(MIGRATIONS)}: start its node once with this version "
                          "(that upgrades the file), then ask again")  # fmt: skip
    return ledger


def read_snapshot(ledger: Ledger, quorum: int | None = None, now_ms: int | None = None) -> Snapshot:
    """Read what the report shows. `quorum` defaults to the campaign's, else 1."""
    read_at = int(datetime.now(timezone.utc).timestamp() * 1000) if now_ms is None else now_ms
    terms = ledger.terms()
    campaigns = [terms["name"]] if terms else [  # a bootstrap's ledger: the campaigns it holds
        r["campaign"] for r in ledger.rows(
            "SELECT campaign FROM results UNION SELECT campaign FROM verifications ORDER BY 1")
    ]  # fmt: skip
    quorum = quorum or ledger.quorum()
    results = ledger.rows(
        "SELECT id, author, time, profile, parent, child, harness, outcome, val_bpb, description "
        "FROM results ORDER BY time, id"
    )
    verifications = ledger.rows(
        "SELECT result, author, verdict, profile, harness, delta, seed FROM verifications"
    )
    judged: dict = {}
    for profile in sorted({r["profile"] for r in results if r["outcome"] == "keep"}):
        judged.update(ledger.standings(profile, quorum, every=True)[1])
    verified = {rid: set(j.peers) for rid, j in judged.items() if j.state == "verified"}
    refuted = {rid for rid, j in judged.items() if j.state in ("refuted", *consensus.DISQUALIFYING)}
    held = {rid: j.reason for rid, j in judged.items() if j.state == consensus.HELD}
    board = ledger.leaderboard(quorum, BOARD_LIMIT)
    baselines = {ledger.baseline()}
    lineages = {profile: _lineage(ledger, rows[0]["child"]) for profile, rows in board.items()}
    noise = {
        r["profile"]: ledger.paired_differences(r["profile"])
        for r in ledger.rows("SELECT DISTINCT profile FROM runs WHERE profile IS NOT NULL")
    }
    peers = _peer_stats(results, verifications, verified, refuted)
    colours = {
        p["peer_id"]: PALETTE[i] if i < COLOURED_PEERS else OTHER_COLOUR
        for i, p in enumerate(peers)
    }
    profiles = sorted({r["profile"] for r in results})
    baseline_bpb = {p: bpb for p in profiles if (bpb := _baseline_bpb(ledger, p)) is not None}
    heads = {p: _head_over_time(ledger, p, quorum, board.get(p)) for p in profiles}
    return Snapshot(
        path=str(ledger.path), read_at=read_at, campaigns=campaigns,
        quorum=quorum, results=results, verified=verified, refuted=refuted, held=held, board=board,
        lineages=lineages, baselines=baselines, peers=peers, noise=dict(sorted(noise.items())),
        colours=colours, baseline_bpb=baseline_bpb, heads=heads,
    )  # fmt: skip


def _baseline_bpb(ledger: Ledger, profile: str) -> float | None:
    """The baseline's val_bpb on `profile`: the median of its paired runs, as the results built
    on it report them and as this node ran it; None when nothing measured it."""
    values = sorted(
        r["v"] for r in ledger.rows(
            "SELECT parent_val_bpb AS v FROM results WHERE profile = ? AND parent = ? "
            "AND parent_val_bpb IS NOT NULL UNION ALL SELECT val_bpb FROM runs WHERE profile = ? "
            "AND child = ? AND parent = child AND val_bpb IS NOT NULL",
            (profile, ledger.baseline(), profile, ledger.baseline()),
        )
    )  # fmt: skip
    return statistics.median(values) if values else None


def _head_over_time(
    ledger: Ledger, profile: str, quorum: int, board: list[dict] | None
) -> list[tuple[int, float]]:
    """(time, the head's score) from the first experiment on, a point each time it moved: the
    rule (`consensus.standings`) applied to the facts held at each look (HEAD_POINTS of them at
    most), and last the head this ledger holds now (`board`)."""
    results, _ = ledger.claim_rows(profile)
    looks = ledger.rows(
        f"SELECT {LOOK_COLUMNS}, time FROM verifications WHERE profile = ?", (profile,)
    )
    first = ledger.rows("SELECT MIN(time) AS t FROM results WHERE profile = ?", (profile,))[0]["t"]
    heads = [(first, 0.0)]
    times = sorted({v["time"] for v in looks})
    if len(times) > HEAD_POINTS:
        times = [times[round(i * (len(times) - 1) / (HEAD_POINTS - 1))] for i in range(HEAD_POINTS)]
    rules, baseline = ledger.rules(profile, quorum), ledger.baseline()
    for t in times:
        scores, _ = consensus.standings(
            [r for r in results if r["time"] <= t], [v for v in looks if v["time"] <= t],
            profile, baseline, rules,
        )  # fmt: skip
        score = scores[consensus.head_of(scores)].score if scores else 0.0
        if score != heads[-1][1]:
            heads.append((t, score))
    now = board[0]["score"] if board else 0.0
    if now != heads[-1][1]:  # the ledger's own judgement, when the replay above differs
        heads.append((max(times[-1:] or [first]), now))
    return heads


def _lineage(ledger: Ledger, child: str) -> list[dict]:
    """The chain to `child`, each step with the diff from its parent, or None when this ledger
    does not hold both versions (they travel by hash and may not have been fetched)."""
    steps = ledger.lineage(child)
    for step in steps:
        parent, made = ledger.version(step["parent"]), ledger.version(step["child"])
        step["missing"] = [
            name for name, src in (("parent", parent), ("child", made)) if src is None
        ]
        step["diff"] = None
        if parent is not None and made is not None:
            old = parent.decode("utf-8", "replace").splitlines(keepends=True)
            new = made.decode("utf-8", "replace").splitlines(keepends=True)
            step["diff"] = "".join(difflib.unified_diff(old, new, "a/train.py", "b/train.py"))
    return steps


def _peer_stats(
    results: list[dict], verifications: list[dict], verified: dict, refuted: set[str]
) -> list[dict]:
    """Per author of a result or a verification: what it tried and how its claims fared; the
    most active first."""
    stats: dict[str, Counter] = {}
    for r in results:
        s = stats.setdefault(r["author"], Counter())
        s["experiments"] += 1
        s[r["outcome"]] += 1
        s["verified"] += r["id"] in verified
        s["refuted"] += r["id"] in refuted
    for v in verifications:
        stats.setdefault(v["author"], Counter())["verifications"] += 1
    rows = [
        {"peer_id": peer, **{k: s[k] for k in ("experiments", "keep", "discard", "crash", "void",
                                               "verified", "refuted", "verifications")}}
        for peer, s in stats.items()
    ]  # fmt: skip
    return sorted(rows, key=lambda p: (-p["experiments"], -p["verifications"], p["peer_id"]))


# ---------------------------------------------------------------- the picture


def plot(snap: Snapshot) -> bytes:
    """The PNG of `figure`."""
    return _png(figure(snap))


def figure(snap: Snapshot):
    """val_bpb per experiment over time, one panel per profile, with the baseline's val_bpb and
    the head's (the baseline less its verified gains) as lines over time."""
    from matplotlib import dates as mdates
    from matplotlib import patheffects, transforms
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    profiles = sorted({r["profile"] for r in snap.results})
    fig = Figure(figsize=(11, 1.5 + 3.4 * len(profiles) if profiles else 2.5), dpi=100)
    FigureCanvasAgg(fig)
    if not profiles:
        ax = fig.add_subplot()
        ax.set_axis_off()
        ax.text(0.5, 0.5, "nothing tried yet", ha="center", va="center", fontsize=16)
        return fig
    axes = fig.subplots(len(profiles), 1, squeeze=False)[:, 0]
    for ax, profile in zip(axes, profiles, strict=True):
        rows = [r for r in snap.results if r["profile"] == profile]
        when = lambda rs: mdates.date2num([_utc(r["time"]) for r in rs])  # noqa: E731
        top = transforms.blended_transform_factory(ax.transData, ax.transAxes)
        authors = {r["author"] for r in rows}
        for peer in [p["peer_id"] for p in reversed(snap.peers) if p["peer_id"] in authors]:
            # The least active first, so that the grey crowd of "other peers" lies underneath.
            colour = snap.colours.get(peer, OTHER_COLOUR)
            mine = [r for r in rows if r["author"] == peer]
            kept = [r for r in mine if r["outcome"] == "keep" and r["val_bpb"] is not None]
            dropped = [r for r in mine if r["outcome"] == "discard" and r["val_bpb"] is not None]
            crashed = [r for r in mine if r["outcome"] == "crash"
                       or (r["outcome"] != "void" and r["val_bpb"] is None)]  # fmt: skip
            voided = [r for r in mine if r["outcome"] == "void"]
            wins = [r for r in kept if r["id"] in snap.verified]
            ax.scatter(when(kept), [r["val_bpb"] for r in kept], s=22, color=colour, zorder=3)
            ax.scatter(when(dropped), [r["val_bpb"] for r in dropped], s=22, facecolors="none",
                       edgecolors=colour, zorder=2)  # fmt: skip
            ax.scatter(when(crashed), [0.97] * len(crashed), marker="x", s=30, color=colour,
                       transform=top, clip_on=False, zorder=3)  # fmt: skip
            ax.scatter(when(voided), [0.97] * len(voided), marker="s", s=26, facecolors="none",
                       edgecolors=colour, transform=top, clip_on=False, zorder=3)  # fmt: skip
            ax.scatter(when(wins), [r["val_bpb"] for r in wins], marker="*", s=170, color=colour,
                       edgecolors="black", linewidths=0.8, zorder=4)  # fmt: skip
        if (base := snap.baseline_bpb.get(profile)) is not None:
            # The head's score is minus its verified gains from the baseline: drawn from the
            # baseline's measured val_bpb, it is where the swarm stands, claims aside.
            end = max(rows[-1]["time"], snap.heads[profile][-1][0])
            ax.hlines(base, *mdates.date2num([_utc(rows[0]["time"]), _utc(end)]), colors="grey",
                      linestyles="dashed", linewidth=1.2, zorder=1, label="baseline")  # fmt: skip
            xs = [t for t, _ in snap.heads[profile]] + [end]
            ys = [base + score for _, score in snap.heads[profile]]
            ax.step(mdates.date2num([_utc(t) for t in xs]), [*ys, ys[-1]], where="post",
                    color="black", linewidth=1.6, zorder=5, label="head",
                    path_effects=[patheffects.withStroke(linewidth=3.5, foreground="white")])  # fmt: skip
        counts = Counter(r["outcome"] for r in rows)
        ax.set_title(f"profile {profile}: {_count(len(rows), 'experiment')} ({counts['keep']} kept, "
                     f"{counts['discard']} discarded, {counts['crash']} crashed, "
                     f"{counts['void']} void)", loc="left", fontsize=11)  # fmt: skip
        ax.set_ylabel("val_bpb (lower is better)")
        ax.grid(alpha=0.3)
        locator = mdates.AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        first, last = rows[0]["time"], rows[-1]["time"]
        if last - first < 600_000:  # a few minutes at least, not a span of years around one point
            middle = (first + last) // 2
            ax.set_xlim(*mdates.date2num([_utc(middle - 300_000), _utc(middle + 300_000)]))
        if not any(r["val_bpb"] is not None for r in rows):
            ax.set_yticks([])
        elif counts["crash"] or counts["void"]:  # room above the scores for that row
            low, high = ax.get_ylim()
            ax.set_ylim(low, high + 0.1 * (high - low))
    axes[-1].set_xlabel("time of the experiment (UTC)")
    handles = [
        Line2D([], [], linestyle="", marker="o", color=snap.colours[p["peer_id"]],
               label=short_peer(p["peer_id"]))
        for p in snap.peers[:COLOURED_PEERS] if p["experiments"]
    ]  # fmt: skip
    if len(snap.peers) > COLOURED_PEERS:
        handles.append(Line2D([], [], linestyle="", marker="o", color=OTHER_COLOUR,
                              label=f"{len(snap.peers) - COLOURED_PEERS} other peers"))  # fmt: skip
    handles += [
        Line2D([], [], linestyle="", marker="o", color="grey", label="kept"),
        Line2D([], [], linestyle="", marker="o", markerfacecolor="none", color="grey",
               label="discarded"),
        Line2D([], [], linestyle="", marker="x", color="grey", label="crashed (top edge)"),
        Line2D([], [], linestyle="", marker="s", markerfacecolor="none", color="grey",
               label="void: broke the harness's rules (top edge)"),
        Line2D([], [], linestyle="", marker="*", markersize=12, color="grey",
               markeredgecolor="black", label=f"verified win (quorum {snap.quorum})"),
        Line2D([], [], color="grey", linestyle="dashed", label="baseline (its measured val_bpb)"),
        Line2D([], [], color="black", label="head: the baseline less its verified gains"),
    ]  # fmt: skip
    axes[0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9,
                   frameon=False)  # fmt: skip
    fig.tight_layout()
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# ---------------------------------------------------------------- the page


def _e(value: object, keep: str = "") -> str:
    """Escaped for HTML text and attribute values: nothing from a fact is ever markup, and its
    control and bidi characters are shown as escapes (`safe_text`), never acted on."""
    return html.escape(safe_text(value, markup=False, keep=keep), quote=True)


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def _peer(peer_id: str | None) -> str:
    if not peer_id:
        return "-"
    return f'<span class="peer" title="{_e(peer_id)}">{_e(short_peer(peer_id))}</span>'


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'s' * (n != 1)}"


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
                   f"{_count(len(steps), 'step')} from {origin}</h3>")  # fmt: skip
        out.append(f'<ol class="lineage" id="lineage-{_e(profile)}">')
        for s in steps:
            if s["diff"] is not None:
                diff = f"<details><summary>diff ({s['diff_size']} B)</summary>{_diff_html(s['diff'])}</details>"
            else:
                diff = f'<p class="muted">diff not held: this ledger lacks the {" and the ".join(s["missing"])} version</p>'
            out.append(
                f"<li><code>{_e(s['child'][:12])}</code> val_bpb {_bpb(s['val_bpb'])} "
                f"(delta {_bpb(s['delta'], True)}, verified delta {_bpb(s['verified_delta'], True)}, "
                f"{_count(s['confirmations'], 'confirmation')}) by "
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
        sigma, df = consensus.paired_noise(pairs, prior=0.0, prior_df=0)
        if df:
            margin = consensus.margin_for(sigma)
            shown = (f"{sigma:.4f} bpb over {df} degrees of freedom; margin {margin:.4f} "
                     f"({consensus.DEFAULT_K:g} standard deviations, at least "
                     f"{consensus.DEFAULT_FLOOR:g})")  # fmt: skip
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
        summary = (f"<p id=\"summary\">{_count(len(snap.results), 'experiment')} by "
                   f"{_count(len(snap.peers), 'peer')}: {counts['keep']} kept, "
                   f"{counts['discard']} discarded, {counts['crash']} crashed, "
                   f"{counts['void']} void; {_count(len(snap.verified), 'verified win')}, "
                   f"{_count(len(snap.refuted), 'refuted claim')} (quorum {snap.quorum})"
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


# ---------------------------------------------------------------- the command


def write_report(
    ledger: Ledger, out: Path, quorum: int | None = None, now_ms: int | None = None
) -> tuple[Path, Path]:
    """Write report.png and report.html into `out` (created if missing); returns their paths."""
    try:
        import matplotlib  # noqa: F401  (an extra: asked for by name before anything is read)
    except ImportError:
        raise ReportError(f"swarm report draws its plot with matplotlib, which is not installed: "
                          f"{EXTRA}") from None  # fmt: skip
    snap = read_snapshot(ledger, quorum, now_ms)
    png = plot(snap)
    page = render_html(snap, png)
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = out / PNG_FILE, out / HTML_FILE
        for path, data in zip(paths, (png, page.encode()), strict=True):
            partial = path.with_name(path.name + ".partial")
            partial.write_bytes(data)
            os.replace(partial, path)
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror}") from None
    return paths
