"""The report's picture: val_bpb per experiment over time, one panel per profile (matplotlib,
an extra, imported only here and only when drawing)."""

from __future__ import annotations

import io
from collections import Counter

from node.readable import count, utc
from node.readable import peer as short_peer
from node.report.reading import COLOURED_PEERS, OTHER_COLOUR, Snapshot


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
        when = lambda rs: mdates.date2num([utc(r["time"]) for r in rs])  # noqa: E731
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
            ax.hlines(base, *mdates.date2num([utc(rows[0]["time"]), utc(end)]), colors="grey",
                      linestyles="dashed", linewidth=1.2, zorder=1, label="baseline")  # fmt: skip
            xs = [t for t, _ in snap.heads[profile]] + [end]
            ys = [base + score for _, score in snap.heads[profile]]
            ax.step(mdates.date2num([utc(t) for t in xs]), [*ys, ys[-1]], where="post",
                    color="black", linewidth=1.6, zorder=5, label="head",
                    path_effects=[patheffects.withStroke(linewidth=3.5, foreground="white")])  # fmt: skip
        counts = Counter(r["outcome"] for r in rows)
        ax.set_title(f"profile {profile}: {count(len(rows), 'experiment')} ({counts['keep']} kept, "
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
            ax.set_xlim(*mdates.date2num([utc(middle - 300_000), utc(middle + 300_000)]))
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
