"""The node behind `swarm join`: gossip, research workers and one ledger, wired together.

Gossip runs in a thread of its own (trio stays inside `node.gossip`). Each research worker runs
in a thread of its own with its own ledger connection: one per GPU, or one on the CPU. They share
only the ledger file: a worker's signed facts enter it, and the gossip layer sends on what this
node authored. A stop ends the current run (no result is made of it) and leaves the ledger
consistent; a restart resumes from the ledger.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from node import wire
from node.campaign import Campaign, budget_warning, check_data, pinned_budget
from node.errors import SwarmError
from node.home import compiled_dir, data_dir
from node.identity import load_identity

if TYPE_CHECKING:
    from node.agent.crew import Crew
    from node.trainer.compile_cache import CompileCache
    from node.trainer.runner import GpuTurns

log = logging.getLogger(__name__)
STATUS_DIR = "status"  # HOME/status/worker-N.json, written by each worker as it goes
IDLE_AFTER_REFUSALS = 3  # refused steps in a row before a worker waits for news
IDLE_SECONDS = 30.0
WORKERS_PER_GPU = 2  # research workers a GPU: one run starts up while the other trains
STALE_SECONDS = (
    60.0  # a gossip status unwritten this long: its node stopped (it writes every second)
)


class NodeError(SwarmError):
    """The node cannot start as asked: the message says what to change."""


@dataclass
class NodeConfig:
    home: Path
    bootstrap: list[str] = field(default_factory=list)
    listen: str = "/ip4/0.0.0.0/tcp/0"
    profile: str = "cpu"
    data: str | None = None  # replaces the profile's data, as `swarm run --data`
    campaign: str = "default"
    campaign_file: Campaign | None = (
        None  # a signed campaign: its baseline, program and quorum rule
    )
    model: str | None = None  # a litellm model name; None: the offline proposer
    api_base: str | None = None
    max_cost_usd: float = 5.0
    quorum: int = 1
    verify_every: int = 4
    gpus: str = "all"  # "all" or how many GPUs to use, one worker each
    seed: int | None = None  # orders the offline proposer's changes; None: the node's key does
    proposer: str = "learning"  # the offline proposer's kind: learning, or fixed (a control)
    sandbox: bool | None = None  # None: whenever available; False only when the user says so
    trust: list[str] = field(default_factory=list)  # peer ids whose code runs without a sandbox


def confined(config: NodeConfig) -> bool:
    """Whether this node runs train.py in the sandbox: whenever bubblewrap can run here, unless
    the user said --no-sandbox."""
    from node.trainer.sandbox import sandbox_available

    return config.sandbox is not False and sandbox_available()


def worker_devices(profile_device: str, gpus: str) -> list[int | None]:
    """One entry per research worker: a CUDA device index, or None for the CPU."""
    if profile_device != "cuda":
        return [None]
    import torch

    count = torch.cuda.device_count()
    wanted = count if gpus == "all" else int(gpus)
    if not 1 <= wanted <= count:
        raise NodeError(
            f"--gpus {gpus}: this machine has {count} CUDA GPU(s); pass 'all' or 1 to {count}"
        )
    return list(range(wanted))


def worker_slots(devices: list[int | None]) -> list[tuple[int | None, GpuTurns | None]]:
    """Each research worker's device and the turns it shares with the others on it:
    WORKERS_PER_GPU on each GPU, whose runs take turns (one starts up and compiles while the
    other trains: `GpuTurns`, docs/node.md), and one on the CPU."""
    from node.trainer.runner import GpuTurns

    turns = {device: GpuTurns() for device in devices if device is not None}
    return [(device, turns.get(device)) for device in devices
            for _ in range(1 if device is None else WORKERS_PER_GPU)]  # fmt: skip


def _program_text() -> str:
    """The research strategy the LLM reads: program.md, shipped in the package (node/program.md
    links to the top-level file, and a wheel holds a copy of it)."""
    path = Path(__file__).with_name("program.md")
    try:
        return path.read_text()
    except OSError as exc:
        raise NodeError(f"cannot read {path} ({exc.strerror}): reinstall research-swarm") from None


def run_node(
    config: NodeConfig, say: Callable[[str], None] = print, stop: threading.Event | None = None
) -> None:
    """Join the swarm and research until `stop` is set or Ctrl-C."""
    from node import network
    from node.agent.crew import Crew
    from node.gossip import GossipConfig
    from node.trainer import get_profile, prepare_data, require_device
    from node.trainer.compile_cache import CompileCache

    home = Path(config.home)
    identity = load_identity(home)
    campaign = config.campaign_file
    if campaign is not None and config.profile not in campaign.profiles:
        raise NodeError(
            f"campaign {campaign.name} runs on {', '.join(campaign.profiles)}, not {config.profile}: "
            f"pass --profile {campaign.profiles[0]}"
        )
    pinned = campaign.data_for(config.profile).get("data") if campaign else None
    profile = get_profile(config.profile, config.data or pinned)
    if budget := pinned_budget(campaign, profile.name):  # the campaign's budget, for every member
        profile = dataclasses.replace(profile, budget_tokens=budget)
    require_device(profile)
    if config.sandbox is not False and not confined(config):
        say(
            "no sandbox (bubblewrap) on this machine: this node runs only its own train.py versions and those "
            f"of the {len(config.trust)} peer(s) you trust (--trust PEER_ID); install bubblewrap (apt-get install "
            "bubblewrap) to verify everyone's, or pass --no-sandbox in a group you trust"
        )
    slots = worker_slots(worker_devices(profile.device, config.gpus))
    tokens = prepare_data(profile, data_dir(home), say)
    if campaign is not None:
        check_data(campaign, profile.name, tokens.manifest)
        _record_campaign(home, campaign)
    else:
        if moved := baseline_moved(home, config.campaign, profile.name):
            say(moved)
        _record_terms(home, open_terms(config.campaign, config.quorum))
    if warning := budget_warning(
        profile.name,
        profile.budget_tokens,
        tokens.manifest,
        f"a campaign that pins it: swarm campaign new --budget {profile.name}={{budget}}",
    ):
        say(warning)
    stop = stop or threading.Event()
    say(
        f"node {identity.peer_id}: campaign {config.campaign}, profile {profile.name}, "
        f"{len(slots)} worker(s), {'model ' + config.model if config.model else config.proposer + ' offline proposer'}, "
        f"{profile.budget_tokens} training tokens a run"
    )

    failures: list[BaseException] = []

    def gossip() -> None:
        try:
            network.run(
                GossipConfig(home, config.listen, config.bootstrap, config.campaign),
                on_ready=lambda addrs: say("listening on " + " ".join(addrs)),
                stop=stop,
                say=say,
            )
        except BaseException as exc:  # the node cannot live without its network: stop it all
            failures.append(exc)
            stop.set()

    threads = [threading.Thread(target=gossip, name="gossip", daemon=True)]
    compiled = CompileCache(compiled_dir(home))  # one store for all workers
    crew = Crew()  # the workers share the experiments in hand and the node's own keeps
    threads += [
        threading.Thread(
            target=_work,
            args=(
                config,
                profile,
                index,
                device,
                tokens,
                compiled,
                crew,
                stop,
                failures,
                turns,
                say,
            ),
            name=f"worker-{index}",
            daemon=True,
        )
        for index, (device, turns) in enumerate(slots)
    ]

    def on_signal(signum: int, _frame) -> None:  # Ctrl-C or a service manager's stop
        say(f"stopping ({signal.Signals(signum).name}): ending the current run")
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_signal)
    for thread in threads:
        thread.start()
    while not stop.is_set():
        stop.wait(0.5)
    for thread in threads:
        thread.join(timeout=30)
    if failures:
        raise failures[0]


def open_terms(campaign: str, quorum: int) -> dict:
    """The terms of a campaign joined by name alone: the built-in baseline, the quorum the user
    chose, no organiser and no members (any key counts)."""
    from node.ledger_queries import builtin_baseline

    return {
        "name": campaign,
        "organiser": None,
        "baseline": builtin_baseline(),
        "quorum": quorum,
        "members": None,
        "fact": None,
    }


def _record_terms(home: Path, terms: dict) -> None:
    """Judge the home's ledger by `terms`: what the user chose, never a stranger's fact."""
    from node.ledger import Ledger, ledger_path

    with Ledger(ledger_path(home), campaign=terms["name"]) as ledger:
        held = ledger.terms()
        if held is not None and held["organiser"] != terms["organiser"]:
            raise NodeError(
                f"this home's ledger belongs to campaign {held['name']} as organised by "
                f"{held['organiser'] or 'nobody (an open campaign)'}: use a fresh --home for this one"
            )
        ledger.set_terms(terms)


def _record_campaign(home: Path, campaign: Campaign) -> None:
    """Judge the ledger by the campaign file's terms, and put the organiser's signed campaign fact
    in it, to be gossiped on."""
    from node.ledger import Ledger, ledger_path

    _record_terms(home, campaign.terms)
    with Ledger(ledger_path(home), campaign=campaign.name) as ledger:
        stored = ledger.ingest(campaign.fact.raw)
    if isinstance(stored, wire.Rejection):
        raise NodeError(
            f"this ledger refuses campaign {campaign.name}'s fact ({stored.reason.value}: {stored.detail}):"
            " use a fresh --home for this campaign"
        )


def baseline_moved(home: Path, campaign: str, profile: str) -> str | None:
    """What to tell a user whose home began on another built-in baseline than this version's (an
    upgrade changed it): the node starts a new lineage. None when nothing moved. The baselines a
    home measured are the versions it scored that no result made: the roots of its lineage."""
    from node.ledger import Ledger, LedgerError, ledger_path
    from node.trainer import BASELINE_TRAIN_PY

    if not ledger_path(home).exists():
        return None
    baseline = hashlib.sha256(
        BASELINE_TRAIN_PY.read_text().encode()
    ).hexdigest()  # as the worker hashes it
    try:
        with Ledger(ledger_path(home), campaign=campaign) as ledger:
            rows = ledger.rows(
                "SELECT DISTINCT child FROM runs r WHERE profile = ? AND parent = child AND description IN "
                "('noise', 'score') AND NOT EXISTS (SELECT 1 FROM results WHERE results.child = r.child)",
                (profile,),
            )
    except LedgerError:  # another campaign's ledger: the worker says so
        return None
    measured = {r["child"] for r in rows}
    if not measured or baseline in measured:  # a new home, or the move was already taken
        return None
    return (
        f"this home's runs began on another baseline ({', '.join(sorted(v[:12] for v in measured))}) than "
        f"this version's built-in train.py ({baseline[:12]}): an upgrade changed it, so the node starts a new lineage "
        "from it; the old runs stay in the ledger, and peers on the old version keep the "
        "old baseline (a campaign file pins one for everybody: swarm campaign new --baseline FILE)"
    )


def _work(
    config: NodeConfig,
    profile,
    index: int,
    device: int | None,
    tokens,
    compiled: CompileCache,
    crew: Crew,
    stop: threading.Event,
    failures: list[BaseException],
    turns: GpuTurns | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """One research worker: its own ledger connection and proposer, step after step until
    stopped, saying what it does as it changes (a run begun, an outcome)."""
    from node.agent import AgentError, LLMProposer
    from node.agent.offline import OFFLINE_PROPOSERS
    from node.agent.researcher import Researcher
    from node.ledger import Ledger, ledger_path
    from node.trainer import BASELINE_TRAIN_PY, RunCancelled, run_experiment

    home = Path(config.home)
    campaign = config.campaign_file
    identity = load_identity(home)
    # Unless told a seed, a node walks the offline proposer's changes in an order of its key's.
    seed = f"{identity.peer_id}:{index}" if config.seed is None else config.seed * 1000 + index
    if config.model:
        proposer = LLMProposer(
            config.model, config.api_base, config.max_cost_usd, spent_path=home / "llm-spend.json"
        )
    else:
        proposer = OFFLINE_PROPOSERS[config.proposer](seed=seed)
    sandbox = confined(config)
    trusted = None if sandbox or config.sandbox is False else set(config.trust).__contains__
    run = functools.partial(run_experiment, sandbox=sandbox, cancel=stop, gpu=device, turns=turns)
    try:
        with Ledger(ledger_path(home), campaign=config.campaign) as ledger:
            researcher = Researcher(
                ledger,
                identity,
                proposer,
                profile,
                tokens,
                home / "runs" / f"worker-{index}",
                campaign.baseline if campaign else BASELINE_TRAIN_PY.read_text(),
                quorum=config.quorum,
                program=campaign.program if campaign else _program_text(),
                verify_every=config.verify_every,
                run=run,
                status_path=home / STATUS_DIR / f"worker-{index}.json",
                trusted=trusted,
                trust=config.trust,
                compile_cache=compiled,
                crew=crew,
                say=lambda line: say(f"{time.strftime('%H:%M:%S')} worker {index}: {line}"),
                calibrate=not config.bootstrap,  # alone: no peer's looks to learn its noise from
            )
            refusals = 0
            while not stop.is_set():
                try:
                    step = researcher.step()
                except AgentError as exc:
                    log.warning("worker %d: %s", index, exc)
                    stop.wait(IDLE_SECONDS)
                    continue
                refusals = refusals + 1 if getattr(step, "outcome", None) == "refused" else 0
                if refusals >= IDLE_AFTER_REFUSALS:  # nothing new to try: wait for the swarm
                    stop.wait(IDLE_SECONDS)
    except RunCancelled:
        return
    except BaseException as exc:
        failures.append(exc)
        stop.set()


def node_running(network: dict | None, now: float) -> bool:
    """Whether the process that wrote this gossip status (`read_status`) still runs: it names its
    pid and rewrites the file every second, so a dead pid or a file long unwritten means no."""
    if not network or now - float(network.get("time") or 0) > STALE_SECONDS:
        return False
    try:
        os.kill(int(network["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, TypeError, ValueError):
        return isinstance(network.get("pid"), int)  # another user's process runs
    return True


def node_status(home: Path) -> dict:
    """What the node in `home` is doing: its workers, its network, its ledger; `running`, and
    when not, `stopped_at`: the last time it wrote its status (seconds since the epoch)."""
    from node.gossip import GossipError, read_status
    from node.ledger import Ledger, LedgerError, ledger_path

    workers = []
    for path in sorted((Path(home) / STATUS_DIR).glob("worker-*.json")):
        try:
            workers.append(
                {
                    "worker": path.stem,
                    "updated": path.stat().st_mtime,
                    **json.loads(path.read_text()),
                }
            )
        except (OSError, ValueError):
            continue
    try:
        network = read_status(home)
    except GossipError:
        network = None
    ledger = {}
    if ledger_path(home).is_file():
        try:
            with Ledger(ledger_path(home), readonly=True) as book:
                ledger = book.summary()
        except LedgerError as exc:  # a node creating it, or a file that is no ledger
            ledger = {"path": str(ledger_path(home)), "error": str(exc)}
    if not workers and network is None and not ledger:
        raise NodeError(
            f"no node in {home}: start one with `swarm join --home {home} --bootstrap ADDR`"
        )
    now = time.time()
    running = node_running(network, now)
    last = [float(network["time"])] if network and network.get("time") else []
    last += [w["updated"] for w in workers]
    return {
        "home": str(home),
        "now": now,
        "running": running,
        "stopped_at": None if running or not last else max(last),
        "workers": workers,
        "network": network,
        "ledger": ledger,
    }
