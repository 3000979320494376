"""`swarm status` and `swarm peers`: what the node in a home is doing, or last did.

Read-only: they read the status files a node writes as it goes, and its ledger, and never create
a home. Of a node that has stopped they say so first, with the time it stopped.
"""

from __future__ import annotations

import json
import time

from rich.table import Table

from node.cli import app
from node.cli.shared import HomeOption, JsonOption, ago, console, date_of, not_running_line
from node.safe_text import safe_text


@app.command("peers")
def peers_cmd(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """What the node in this home sees, or last saw if it stopped: addresses, peers, counts.

    Each peer's standing, with the reasons a peer lost it (its facts are then dropped and its
    claims not run); messages dropped and bad fetches, by sender.

    Example: swarm peers --home ~/.research-swarm
    """
    from node.gossip import read_status
    from node.home import resolve_home
    from node.node import node_running

    home_dir = resolve_home(home, create=False)
    status = read_status(home_dir)
    running = node_running(status, time.time())
    status = {**status, "running": running, "stopped_at": None if running else status.get("time")}
    if as_json:
        print(json.dumps(status))
        return
    if not running:
        console.print(
            not_running_line(home_dir, status["stopped_at"]), highlight=False, markup=False
        )
    title = "gossip" if running else "gossip when it stopped"
    table = Table(title=f"{title}: {status['peer_id']}", show_header=False)
    for addr in status["addrs"]:
        table.add_row("address", addr)
    table.add_row("campaign", str(status["campaign"]))
    table.add_row("connected", str(len(status["connected"])))
    table.add_row("in the mesh", str(len(status.get("mesh", []))))
    table.add_row("known peers", str(status["known"]))
    table.add_row("banned", str(len(status["banned"])))
    table.add_row("silenced", str(len(status.get("silenced", []))))
    table.add_row("facts held", str(status["facts"]))
    for key, value in status["counts"].items():
        table.add_row(key, str(value))
    console.print(table)
    mesh = set(status.get("mesh", []))
    for peer in status["connected"]:  # the mesh: the peers a fact goes to first
        console.print(f"  {peer}{'  (mesh)' if peer in mesh else ''}")
    if status.get("standing"):
        _print_standing(status["standing"])
    if status.get("drops") or status.get("bad_sources"):
        _print_drops(status.get("drops", []), set(status.get("bad_sources", [])))


def _print_drops(rows: list[dict], bad_sources: set[str]) -> None:
    """Messages dropped unread, by the peer they are counted against; peers that served bytes
    failing their hash, which are never asked to fetch again."""
    table = Table(title="dropped messages and bad fetches, by sender")
    table.add_column("peer", no_wrap=True, min_width=52)
    table.add_column("dropped", overflow="fold")
    table.add_column("served bad bytes")
    shown = {r["peer"] for r in rows}
    for r in rows:
        dropped = ", ".join(f"{k} {v}" for k, v in sorted(r["counts"].items()))
        table.add_row(r["peer"], safe_text(dropped), "yes" if r["peer"] in bad_sources else "")
    for peer in sorted(bad_sources - shown):
        table.add_row(peer, "-", "yes")
    console.print(table)


def _print_standing(rows: list[dict]) -> None:
    table = Table(title="standing (from the ledger's facts and this node's refusals)")
    for name in ("peer", "standing", "claims verified", "looks outlying", "refused", "why"):
        table.add_column(name, overflow="fold" if name in ("refused", "why") else "ellipsis")
    for s in rows:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(s["offences"].items())) or "-"
        table.add_row(
            s["peer"][-12:],
            s["status"],
            f"{s['verified']} of {s['claims']}",
            f"{s['outlying']} of {s['looks'] + s['outlying']}",
            safe_text(refused),
            safe_text("; ".join(s["reasons"]) or "-"),
        )
    console.print(table)


@app.command("status")
def status_cmd(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """What the node in this home is doing, or last did if it stopped: workers, head, peers.

    Each worker's experiment and progress, its head and noise margin; the network; the ledger.
    Of a stopped node: that it is not running, and since when.

    Example: swarm status --home ~/.research-swarm
    """
    from node.home import resolve_home
    from node.node import node_status

    home_dir = resolve_home(home, create=False)
    status = node_status(home_dir)
    if as_json:
        print(json.dumps(status))
        return
    if not status["running"]:
        console.print(
            not_running_line(home_dir, status["stopped_at"]), highlight=False, markup=False
        )
    for worker in status["workers"]:
        table = Table(title=f"{worker['worker']} ({worker.get('profile')})", show_header=False)
        progress = worker.get("progress")
        doing = safe_text(worker.get("doing"))  # it may quote a peer's description
        table.add_row(
            "doing" if status["running"] else "was doing",
            doing + (f"  {progress:.0%}" if progress is not None else ""),
        )
        bpb = worker.get("head_val_bpb")
        table.add_row(
            "head",
            f"{(worker.get('head') or '-')[:16]}  val_bpb "
            + (f"{bpb:.4f}" if isinstance(bpb, (int, float)) else "-"),
        )
        sigma, df = worker.get("sigma"), worker.get("sigma_df")
        noise = f"{worker.get('margin'):.4f}" if isinstance(worker.get("margin"), float) else "-"
        if isinstance(sigma, float):  # the spread of one paired difference, and what is behind it
            prior = "" if df else ": the prior"
            noise += f"  (paired sigma {sigma:.4f}, {df or 0} degrees of freedom{prior})"
        table.add_row("noise margin", noise)
        table.add_row("proposer", safe_text(worker.get("proposer") or "-"))
        table.add_row("steps", str(worker.get("steps")))
        table.add_row("verifications pending", str(worker.get("pending_verifications", "-")))
        table.add_row(
            "updated", f"{date_of(worker['updated'])} ({ago(status['now'] - worker['updated'])})"
        )
        console.print(table)
    network = status["network"]
    if network:
        console.print(
            f"network: {len(network['connected'])} peers connected"
            f"{'' if status['running'] else ' when it stopped'}, {network['facts']} facts held "
            f"({network['peer_id']})"
        )
        for s in network.get(
            "standing", []
        ):  # why a peer's facts are dropped: `swarm peers` has the rest
            if s["status"] == "silenced":
                why = safe_text("; ".join(s["reasons"]))
                console.print(f"silenced {s['peer']}: {why}", highlight=False)
    ledger = status["ledger"]
    if ledger.get("error"):
        console.print(f"ledger: {ledger['error']}", highlight=False, markup=False)
    elif ledger:
        counts = [
            f"{k} {v}"
            for k, v in ledger.items()
            if isinstance(v, int) and not isinstance(v, bool) and k != "last_received"
        ]
        if ledger.get("last_received"):
            counts.append(f"last fact received {date_of(ledger['last_received'] / 1000)}")
        console.print(f"ledger: {ledger.get('path')}: " + ", ".join(counts), highlight=False)
