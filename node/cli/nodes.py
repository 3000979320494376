"""The commands that start nodes: `swarm peer`, `swarm join` and `swarm local` (`swarm bootstrap`
is the bootstrap package's)."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

from node.cli import app
from node.cli.campaign import campaign_from_peer, campaign_or_name
from node.cli.shared import (
    DataOption,
    HomeOption,
    JsonOption,
    ListenOption,
    ProfileOption,
    ProposerOption,
    bootstrap_addrs,
    console,
    err_console,
    gpus_option,
    prepare,
    proposer_option,
    status_line,
    stop_on_signal,
)
from node.errors import SwarmError

BootstrapOption = Annotated[
    list[str] | None,
    typer.Option(
        "--bootstrap", help="Full multiaddr of any peer already in the swarm (repeatable)."
    ),
]


@app.command("peer")
def peer_cmd(
    campaign: Annotated[
        str, typer.Option("--campaign", help="The campaign whose facts to gossip.")
    ],
    bootstrap: BootstrapOption = None,
    listen: ListenOption = "/ip4/0.0.0.0/tcp/0",
    home: HomeOption = None,
) -> None:
    """Run a gossiping node without training: find peers, sync, relay and store facts.

    Facts that other processes write into this home's ledger under this node's key are
    gossiped as they appear. `swarm peers --home DIR` shows what the node sees.

    Example: swarm peer --campaign demo --bootstrap /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...
    """
    from node import network
    from node.gossip import GossipConfig
    from node.home import resolve_home

    peers = bootstrap_addrs(bootstrap or [])
    network.run(
        GossipConfig(home=resolve_home(home), listen=listen, bootstrap=peers, campaign=campaign),
        say=status_line,
        stop=stop_on_signal(),
    )


@app.command("join")
def join_cmd(
    bootstrap: BootstrapOption = None,
    profile: ProfileOption = "cpu",
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="An LLM through litellm, e.g. anthropic/claude-sonnet-4-5 or openai/NAME; default: the offline proposer.",
        ),
    ] = None,
    api_base: Annotated[
        str | None,
        typer.Option(
            "--api-base",
            help="A local OpenAI-style server, e.g. http://127.0.0.1:11434/v1 (Ollama, vLLM).",
        ),
    ] = None,
    max_cost: Annotated[
        float, typer.Option("--max-cost", help="Dollars this node may spend on the model, in all.")
    ] = 5.0,
    campaign: Annotated[
        str,
        typer.Option(
            "--campaign",
            help="A campaign file (swarm campaign new), or a name for a campaign on the built-in baseline; nodes of other campaigns never mix facts.",
        ),
    ] = "default",
    quorum: Annotated[
        int | None,
        typer.Option(
            "--quorum",
            help="Distinct confirmers other than the author before a win is adopted (default: the campaign file's, else 1).",
        ),
    ] = None,
    gpus: Annotated[
        str,
        typer.Option(
            "--gpus", help="'all' or how many GPUs to use: two research workers each, taking turns."
        ),
    ] = "all",
    verify_every: Annotated[
        int,
        typer.Option(
            "--verify-every", help="Every n-th experiment re-runs a peer's claim (0: never verify)."
        ),
    ] = 4,
    listen: ListenOption = "/ip4/0.0.0.0/tcp/0",
    data: DataOption = None,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed",
            help="Orders the offline proposer's changes, the same for the same seed (default: drawn from this node's key).",
        ),
    ] = None,
    proposer: ProposerOption = "learning",
    sandbox: Annotated[
        bool,
        typer.Option(
            "--sandbox/--no-sandbox",
            help="--no-sandbox runs peers' train.py unconfined: only in a group you trust.",
        ),
    ] = True,
    trust: Annotated[
        list[str] | None,
        typer.Option(
            "--trust",
            help="A peer id whose train.py this node runs when it has no sandbox (repeatable).",
        ),
    ] = None,
    home: HomeOption = None,
) -> None:
    """Join the swarm and research until Ctrl-C: propose, run, verify peers' claims, adopt verified wins.

    A restart with the same --home resumes from the ledger. `swarm status` shows what it is doing.

    Example: swarm join --bootstrap /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW... --profile cpu
    """
    from node.gossip.addresses import check_port_free
    from node.home import resolve_home
    from node.node import NodeConfig, run_node

    # What the user typed is checked before any home, key or data is made.
    bootstrap = bootstrap_addrs(bootstrap or [])
    gpus = gpus_option(gpus)
    proposer = proposer_option(proposer, model)
    check_port_free(listen)  # a malformed --listen, or a port taken
    trusted = _peer_ids(trust or [])
    if quorum is not None and quorum < 1:
        raise SwarmError("--quorum must be at least 1: a claim cannot verify itself")
    if verify_every < 0:
        raise SwarmError("--verify-every must be 0 (never) or more")
    home_dir = resolve_home(home)  # a home that cannot be used, too
    spec = campaign_or_name(campaign)
    if isinstance(spec, str) and spec.startswith("sha256:"):
        spec = campaign_from_peer(home_dir, bootstrap, spec.removeprefix("sha256:"))
    if isinstance(spec, str) and quorum is None:
        quorum = 1
    if not isinstance(spec, str) and quorum is not None and quorum != spec.quorum:
        raise SwarmError(
            f"campaign {spec.name} sets quorum {spec.quorum}: leave out --quorum {quorum}"
        )
    config = NodeConfig(
        home=home_dir,
        bootstrap=bootstrap,
        listen=listen,
        profile=profile,
        data=data,
        campaign=spec if isinstance(spec, str) else spec.name,
        campaign_file=None if isinstance(spec, str) else spec,
        model=model,
        api_base=api_base,
        max_cost_usd=max_cost,
        quorum=quorum or spec.quorum,
        gpus=gpus,
        seed=seed,
        proposer=proposer,
        verify_every=verify_every,
        trust=trusted,
        sandbox=None if sandbox else False,
    )
    run_node(config, say=status_line)


def _peer_ids(values: list[str]) -> list[str]:
    from node.identity import IdentityError, public_key_from_peer_id

    for value in values:
        try:
            public_key_from_peer_id(value)
        except (IdentityError, ValueError):
            raise SwarmError(
                f"--trust {value[:60]}: not a peer id (12D3KooW...); `swarm keys show` prints one"
            ) from None
    return values


@app.command("local")
def local_cmd(
    nodes: Annotated[int, typer.Option("--nodes", help="How many research nodes to start.")] = 3,
    minutes: Annotated[
        float,
        typer.Option("--minutes", help="How long the swarm runs before it stops and reports."),
    ] = 10.0,
    profile: ProfileOption = "cpu",
    campaign: Annotated[
        str,
        typer.Option("--campaign", help="A campaign file, or a campaign name (default: local)."),
    ] = "local",
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="An LLM through litellm for every node; default: the offline proposer."
        ),
    ] = None,
    api_base: Annotated[
        str | None, typer.Option("--api-base", help="A local OpenAI-style server for --model.")
    ] = None,
    proposer: ProposerOption = "learning",
    seed: Annotated[
        int,
        typer.Option(
            "--seed", help="Node i orders the offline proposer's changes by SEED + i (default 0)."
        ),
    ] = 0,
    data: DataOption = None,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh", help="Forget the earlier local swarm's ledgers first (default: resume them)."
        ),
    ] = False,
    sandbox: Annotated[
        bool, typer.Option("--sandbox/--no-sandbox", help="--no-sandbox runs train.py unconfined.")
    ] = True,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """A whole swarm on this machine: a bootstrap and NODES nodes on 127.0.0.1, live progress, then the results.

    Ledgers and logs stay under HOME/local/ for `swarm ledger ... --home HOME/local/node0` and `swarm report`.

    Example: swarm local --nodes 3 --minutes 10 --profile cpu
    """
    from node.home import resolve_home
    from node.local import (
        LocalSwarm,
        progress_line,
        reset,
        run_local,
        status_table,
        summary_lines,
        swarm_command,
    )

    if nodes < 1 or minutes <= 0:
        raise SwarmError("--nodes must be at least 1 and --minutes more than 0")
    proposer = proposer_option(proposer, model)
    root = resolve_home(home) / "local"
    if fresh:
        reset(root)
    swarm = LocalSwarm(
        root, nodes, profile, minutes, campaign, model, api_base, data, sandbox, proposer, seed
    )
    prepare(profile, data, root.parent)  # the data, built once before the nodes start
    if console.is_terminal and not as_json:
        from rich.live import Live

        with Live(console=console, refresh_per_second=2) as live:
            result = run_local(
                swarm,
                lambda line: live.console.print(line, markup=False, highlight=False),
                lambda rows, left, recent: live.update(status_table(rows, left, recent)),
            )
    else:  # a log, not a terminal: each event as it happens, and the nodes' state every 30 s
        last = [0.0]

        def show(rows: list[dict], left: float, _recent: list[str]) -> None:
            if time.monotonic() - last[0] >= 30:
                last[0] = time.monotonic()
                say(progress_line(rows, left))

        def say(line: str) -> None:
            err_console.print(line, style="dim", markup=False, highlight=False)

        result = run_local(swarm, say, show)
    if as_json:
        print(json.dumps(result))
        return
    console.print()
    for line in summary_lines(result, swarm_command()):
        console.print(line, markup=False, highlight=False)
