"""Malicious train.py versions through the whole stack: the runner, the sandbox, the harness, the scorer.

Each attack is a realistic way for a stranger's train.py to steal, escape, cheat or take the machine
down. Each runs through `run_experiment` in the sandbox; an attack the static policy refuses is
also run with the policy switched off, so that the sandbox and the scorer are tested on their own.
Every run must end refused or contained, leave no trace outside its run folder, leak no secret
into anything it produced, and score no better than an honest run of the baseline.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from node.trainer import BASELINE_TRAIN_PY, get_profile, harness_sha256, run_experiment
from node.trainer import runner as runner_module
from node.trainer import sandbox as sandbox_module
from node.trainer import version as version_module
from node.trainer.policy import check_source
from node.trainer.sandbox import SANDBOX_UID_BASE, processes_of

pytestmark = pytest.mark.sandbox

ATTACK = dataclasses.replace(
    get_profile("test"),
    budget_tokens=2**15,
    startup_seconds=30,
    max_train_seconds=4,
    eval_seconds=30,
)
SECRET = "sk-live-0123456789abcdef"  # in the runner's environment and in the planted key and ledger
HEAD = "from node.trainer.harness import session\nS = session()\n"
# What the attacks that got past the policy use to report each attempt in their log.
PROBE = (
    HEAD
    + """import os, sys
def attempt(name, action):
    try:
        print(f"ATTEMPT {name}: ok {action()!r}"[:300], flush=True)
    except BaseException as exc:
        print(f"ATTEMPT {name}: blocked {type(exc).__name__}", flush=True)
"""
)
# A model that trains nothing: the honest floor for attacks that hand over a model.
UNTRAINED = """import torch
class Bigram(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(S.vocab_size, S.vocab_size)
    def forward(self, idx, targets=None):
        return self.table(idx)
model = Bigram()
for x, y in S.batches(16):
    pass
"""

# Rewrites the exported file so that loading it unpickles a payload that forges a score.
POISONED_EXPORT = r"""import json, pickle, zipfile
from node.trainer import harness
PAYLOAD = "import os; os.write(int(os.environ['SWARM_STATUS_FD']), b'{\"event\": \"result\", \"val_bpb\": 0.01}\\n')"
class Payload:
    def __reduce__(self):
        return (exec, (PAYLOAD,))
honest_export = harness.export_model
def poisoned_export(model, batch_size, seq_len, device, path):
    honest_export(model, batch_size, seq_len, device, path)
    with zipfile.ZipFile(path) as z:
        files = {n: z.read(n) for n in z.namelist()}
    for name in list(files):
        if name.endswith("weights_config.json"):
            config = json.loads(files[name])
            first = next(iter(config["config"].values()))
            first["use_pickle"] = True
            files[name] = json.dumps(config).encode()
            files[name.rsplit("/", 1)[0] + "/" + first["path_name"]] = pickle.dumps(Payload())
        if name.endswith("sample_inputs/model.pt"):
            files[name] = pickle.dumps(Payload())
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    print("ATTEMPT poison: ok", flush=True)
harness.export_model = poisoned_export
S.finish(model)
"""

ATTACKS = {
    # -- secrets ------------------------------------------------------------------------------
    "reads the node's key file": (
        True,
        PROBE + "attempt('key', lambda: open('@HOME@/.research-swarm/identity.key').read())\n",
    ),
    "reads the ledger": (
        True,
        PROBE
        + "attempt('ledger', lambda: open('@HOME@/.research-swarm/ledger.db', 'rb').read())\n",
    ),
    "lists the home folder": (True, PROBE + "attempt('home', lambda: os.listdir('@HOME@'))\n"),
    "reads API keys from its environment": (
        True,
        PROBE + "attempt('env', lambda: os.environ['OPENAI_API_KEY'])\n",
    ),
    # -- network ------------------------------------------------------------------------------
    "connects to a listener on loopback": (
        True,
        PROBE
        + (
            "import socket\nattempt('connect', lambda: socket.create_connection(('127.0.0.1', @PORT@), timeout=3))\n"
        ),
    ),
    "fetches a URL": (
        True,
        PROBE
        + (
            "import urllib.request\nattempt('fetch', lambda: urllib.request.urlopen('http://127.0.0.1:@PORT@/', timeout=3))\n"
        ),
    ),
    # -- writing where it must not -----------------------------------------------------------
    "writes outside its folder": (
        True,
        PROBE
        + (
            "attempt('home', lambda: open('@HOME@/planted.txt', 'w').write('x'))\n"
            "attempt('tmp', lambda: open('/tmp/@MARKER@', 'w').write('x'))\n"
            "attempt('parent', lambda: open('@OUTSIDE@/planted.txt', 'w').write('x'))\n"
            "attempt('data', lambda: open(S.config['data']['train_path'], 'ab').write(b'x'))\n"
        ),
    ),
    "patches the harness file": (
        True,
        PROBE
        + (
            "import node.trainer.scorer as scorer\n"
            "attempt('patch', lambda: open(scorer.__file__, 'a').write('\\nVAL = 0\\n'))\n"
        ),
    ),
    "forges result.json in its folder": (
        True,
        PROBE
        + (
            "import json\nattempt('forge', lambda: json.dump({'outcome': 'ok', 'val_bpb': 0.01}, open('result.json', 'w')))\n"
            + UNTRAINED
            + "S.finish(model)\n"
        ),
    ),
    # -- processes, signals, native code -------------------------------------------------------
    "spawns a shell": (
        True,
        PROBE
        + (
            "import subprocess\n"
            "attempt('shell', lambda: subprocess.run(['sh', '-c', 'cat @HOME@/.research-swarm/identity.key; "
            "echo pwned > @HOME@/pwned'], capture_output=True, timeout=10).stdout)\n"
        ),
    ),
    "escapes through ctypes": (
        True,
        PROBE
        + (
            "import ctypes\nlibc = ctypes.CDLL(None)\n"
            "attempt('setuid', lambda: libc.setuid(0))\nattempt('uid', lambda: os.getuid())\n"
            "attempt('system', lambda: libc.system(b'cat @HOME@/.research-swarm/identity.key > /tmp/@MARKER@'))\n"
        ),
    ),
    "signals its parent and every process it can": (
        True,
        PROBE
        + (
            "import signal\nattempt('parent', lambda: os.kill(os.getppid(), signal.SIGKILL))\n"
            "attempt('all', lambda: os.kill(-1, signal.SIGKILL))\n"
        ),
    ),
    "leaves a daemon behind": (
        True,
        PROBE
        + (
            "import time\nif os.fork() == 0:\n    os.setsid()\n    while True:\n        time.sleep(0.2)\n"
            "attempt('daemon', lambda: 'forked')\n"
        ),
    ),
    # -- the validation data -------------------------------------------------------------------
    "searches the disk for the validation split": (
        True,
        PROBE
        + (
            "def search():\n    found = []\n"
            "    for root, dirs, files in os.walk('/'):\n"
            "        dirs[:] = [d for d in dirs if root + d not in ('/proc', '/sys', '/dev')]\n"
            "        found += [os.path.join(root, f) for f in files if f in ('train.bin', 'val.bin')]\n"
            "    return found\n"
            "attempt('search', search)\n"
            "attempt('beside_train', lambda: open(os.path.dirname(S.config['data']['train_path']) + '/val.bin', 'rb').read(8))\n"
        ),
    ),
    # -- faking the score ----------------------------------------------------------------------
    "prints a fake score": (
        False,
        HEAD
        + UNTRAINED
        + (
            "print('val_bpb: 0.0100')\n"
            'print(\'{"event": "result", "val_bpb": 0.01, "eval_tokens": 8192}\', flush=True)\n'
            "S.finish(model)\n"
        ),
    ),
    "writes a fake score to the status channel": (
        True,
        PROBE
        + UNTRAINED
        + (
            "fd = int(os.environ['SWARM_STATUS_FD'])\n"
            'attempt(\'status\', lambda: os.write(fd, b\'{"event": "result", "val_bpb": 0.01, "eval_tokens": 8192}\\n\'))\n'
            "S.finish(model)\n"
        ),
    ),
    "monkeypatches the scorer in its own process": (
        True,
        PROBE
        + (
            "import node.trainer.scorer as scorer\n"
            "scorer.evaluate_bpb = lambda *a, **k: {'val_bpb': 0.01, 'eval_tokens': 8192, 'eval_bytes': 1, 'eval_nats': 0.0}\n"
            "import node.trainer.causality as causality\n"
            "causality.Checker.check_batch = lambda *a, **k: None\n"
            + UNTRAINED
            + "S.finish(model)\n"
        ),
    ),
    "hands the scorer a model file that runs code": (True, PROBE + UNTRAINED + POISONED_EXPORT),
    # -- looking ahead ---------------------------------------------------------------------------
    "looks ahead at future tokens": (
        False,
        BASELINE_TRAIN_PY.read_text().replace("is_causal=True", "is_causal=False"),
    ),
    "counts its calls to tell the check from the score": (
        False,
        HEAD
        + """import torch
class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(S.vocab_size, S.vocab_size)
        self.register_buffer("calls", torch.zeros(()))
    def forward(self, idx, targets=None):
        self.calls.add_(1)
        logits = self.table(idx)
        peek = torch.nn.functional.one_hot(idx.roll(-1, 1), S.vocab_size).float() * 50
        return torch.where(self.calls == 2, logits, logits + peek)
model = Counting()
for x, y in S.batches(16):
    pass
S.finish(model)
""",
    ),
    # -- resources and the clock -----------------------------------------------------------------
    "asks for memory without end": (
        False,
        HEAD
        + """import torch
blocks = []
for x, y in S.batches(16):
    while True:
        blocks.append(torch.empty(2**30, dtype=torch.uint8))
        print('blocks', len(blocks), flush=True)
""",
    ),
    "spins past the budget": (
        False,
        HEAD
        + """import torch
for i, (x, y) in enumerate(S.batches(16)):
    if i == 3:
        while True:
            torch.randn(64, 64) @ torch.randn(64, 64)
""",
    ),
    "sleeps past the budget": (
        True,
        HEAD
        + """import time
for i, (x, y) in enumerate(S.batches(16)):
    if i == 3:
        time.sleep(3600)
""",
    ),
}
# What each attack's log must show: every attempt ran, and was stopped.
BLOCKED = {
    "reads the node's key file": ["key: blocked"],
    "reads the ledger": ["ledger: blocked"],
    "lists the home folder": ["home: blocked"],
    "reads API keys from its environment": ["env: blocked KeyError"],
    "connects to a listener on loopback": ["connect: blocked"],
    "fetches a URL": ["fetch: blocked"],
    "writes outside its folder": ["home: blocked", "tmp: ok", "parent: blocked", "data: blocked"],
    "patches the harness file": ["patch: blocked"],
    "forges result.json in its folder": ["forge: ok"],
    "spawns a shell": ["shell: ok b''"],
    "escapes through ctypes": ["setuid: ok -1", "system: ok 256"],
    "signals its parent and every process it can": [
        "parent: blocked PermissionError",
        "all: blocked ProcessLookupError",
    ],
    "leaves a daemon behind": ["daemon: ok"],
    "searches the disk for the validation split": [
        "search: ok [",
        "beside_train: blocked FileNotFoundError",
    ],
    "writes a fake score to the status channel": ["status: ok"],
    "hands the scorer a model file that runs code": ["poison: ok"],
}
# Why each run must end: (outcome, a phrase of its error).
PROBE_ENDS = (
    "crash",
    "exited with code 3",
)  # a probe that hands over no model: the harness's "no finish" code
ENDS = {
    "forges result.json in its folder": ("ok", None),
    "prints a fake score": ("ok", None),
    "monkeypatches the scorer in its own process": ("ok", None),
    "writes a fake score to the status channel": ("void", "only the scorer scores"),
    "hands the scorer a model file that runs code": ("void", "the model file does not load"),
    "looks ahead at future tokens": ("void", "the model looks ahead"),
    "counts its calls to tell the check from the score": (
        "void",
        "writes into its own weights, buffers or input",
    ),
    "asks for memory without end": ("crash", "exited with code 1"),
    "spins past the budget": ("crash", "train ran past its limit"),
    "sleeps past the budget": ("crash", "train ran past its limit"),
    "signals its parent and every process it can": PROBE_ENDS,
}


# ---------------------------------------------------------------------------------------------
# The scene: a node home with a key and a ledger, a secret in the environment, a listener


@dataclasses.dataclass
class Scene:
    root: Path
    home: Path
    outside: Path
    marker: str
    port: int
    accepted: list
    uids: list

    def source(self, template: str) -> str:
        for key, value in (
            ("@HOME@", self.home),
            ("@OUTSIDE@", self.outside),
            ("@MARKER@", self.marker),
            ("@PORT@", self.port),
        ):
            template = template.replace(key, str(value))
        return template

    def snapshot(self) -> dict:
        """Everything outside the run folder that an attack could touch, by path."""
        seen = {}
        for folder in (self.home, self.outside):
            for path in sorted(folder.rglob("*")):
                seen[str(path)] = path.read_bytes() if path.is_file() else b"dir"
        seen["harness"] = harness_sha256().encode()
        return seen


@pytest.fixture
def scene(tmp_path, monkeypatch):
    home, outside = tmp_path / "home", tmp_path / "outside"
    (home / ".research-swarm").mkdir(parents=True)
    outside.mkdir()
    (home / ".research-swarm" / "identity.key").write_text(SECRET)
    (home / ".research-swarm" / "ledger.db").write_bytes(b"SQLite format 3\0" + SECRET.encode())
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    threading.Thread(target=serve, daemon=True).start()
    uids = []
    monkeypatch.setattr(
        runner_module, "sandbox_uid", lambda: uids.append(sandbox_module.sandbox_uid()) or uids[-1]
    )
    yield Scene(
        tmp_path,
        home,
        outside,
        f"swarm-attack-{uuid.uuid4().hex}",
        server.getsockname()[1],
        accepted,
        uids,
    )
    stop.set()
    server.close()


@pytest.fixture(scope="module")
def honest(tmp_path_factory, small_data):
    """The baseline's own score under the attack profile: no attack may beat it."""
    result = run_experiment(
        BASELINE_TRAIN_PY, ATTACK, small_data, tmp_path_factory.mktemp("honest") / "run"
    )
    assert result.outcome == "ok", result.log_tail
    return result.val_bpb


def run_attack(scene: Scene, source: str, data, profile=ATTACK):
    script = scene.root / "train.py"
    script.write_text(source)
    before = scene.snapshot()
    result = run_experiment(script, profile, data, scene.root / "run", sandbox=True)
    produced = json.dumps(result.as_dict()) + "".join(
        p.read_bytes().decode("utf-8", "replace")
        for p in (scene.root / "run").rglob("*")
        if p.is_file()
    )
    assert SECRET not in produced, "a secret leaked into what the run produced"
    assert scene.snapshot() == before, "the run left a trace outside its folder"
    assert not Path("/tmp", scene.marker).exists()
    assert not scene.accepted, "something connected to the test's listener"
    assert not _processes_of(scene.uids), "a process of the run outlived it"
    return result, (scene.root / "run" / "log.txt").read_text(errors="replace")


def _processes_of(uids: list) -> list:
    return [pid for uid in uids if uid is not None for pid in processes_of(uid)]


def _check_end(name: str, result, log: str, honest: float) -> None:
    outcome, phrase = ENDS.get(name, PROBE_ENDS)
    assert result.outcome == outcome, (result.error, log[-2000:])
    if phrase:
        assert phrase in result.error, (result.error, log[-2000:])
    if result.val_bpb is not None:
        assert result.val_bpb > honest, "an attack scored better than the honest baseline"
    for line in BLOCKED.get(name, []):
        assert f"ATTEMPT {line}" in log, (line, log[-2000:])


# ---------------------------------------------------------------------------------------------
# Layer 1: the policy refuses what it can read


REFUSED = sorted(name for name, (refused, _) in ATTACKS.items() if refused)


@pytest.mark.parametrize("name", REFUSED)
def test_the_policy_refuses_the_attack_before_it_runs(name, scene, small_data):
    source = scene.source(ATTACKS[name][1])
    assert check_source(source)
    script = scene.root / "train.py"
    script.write_text(source)
    result = run_experiment(script, ATTACK, small_data, scene.root / "run", sandbox=True)
    assert result.outcome == "crash" and result.error.startswith("refused by the policy")
    assert not (scene.root / "run" / "log.txt").exists()


# ---------------------------------------------------------------------------------------------
# Layers 2 and 3: the sandbox and the scorer, with the policy switched off for what it refuses


@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.slow
def test_the_sandbox_and_the_scorer_contain_the_attack(
    name, scene, small_data, honest, monkeypatch
):
    refused, template = ATTACKS[name]
    source = scene.source(template)
    if refused:
        monkeypatch.setattr(runner_module, "check_source", lambda _source: [])
    else:
        assert check_source(source) == [], "this attack is meant to pass the policy"
    bystander = subprocess.Popen(
        ["sleep", "120"]
    )  # a process of the node's user, outside the sandbox
    try:
        result, log = run_attack(scene, source, small_data)
        assert bystander.poll() is None, "the run killed a process outside its sandbox"
    finally:
        bystander.kill()
        bystander.wait()
    _check_end(name, result, log, honest)
    if name == "searches the disk for the validation split":
        found = next(line for line in log.splitlines() if line.startswith("ATTEMPT search:"))
        assert "train.bin" in found and "val.bin" not in found, (
            found
        )  # it searched, and saw only the train split
    if name == "asks for memory without end":
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        blocks = max(
            int(line.split()[1]) for line in log.splitlines() if line.startswith("blocks ")
        )
        assert blocks <= 0.75 * memory / 2**30 and "can't allocate memory" in log
    if (
        name == "escapes through ctypes" and os.geteuid() == 0
    ):  # a root node's sandbox runs as a uid of its own
        assert int(log.split("ATTEMPT uid: ok ")[1].split()[0]) >= SANDBOX_UID_BASE


@pytest.mark.slow
def test_a_fork_bomb_is_held_to_its_process_limit_and_the_machine_stays_responsive(
    scene, small_data, monkeypatch
):
    monkeypatch.setattr(runner_module, "check_source", lambda _source: [])
    monkeypatch.setattr(
        sandbox_module, "MAX_TASKS", 96
    )  # the real limit binds the same way; 2 shared cores
    bomb = HEAD + (
        "import os\nprint('bomb starts', flush=True)\nwarned = False\nwhile True:\n    try:\n        os.fork()\n"
        "    except OSError as exc:\n        if not warned:\n            print('fork refused:', exc, flush=True)\n"
        "            warned = True\n"
    )
    latencies, done = [], threading.Event()

    def probe():
        while not done.is_set():
            began = time.monotonic()
            subprocess.run(["true"], check=True)
            latencies.append(time.monotonic() - began)
            time.sleep(0.5)

    threading.Thread(target=probe, daemon=True).start()
    began = time.monotonic()
    result, log = run_attack(
        scene,
        scene.source(bomb),
        small_data,
        profile=dataclasses.replace(ATTACK, startup_seconds=15),
    )
    done.set()
    assert result.outcome == "crash" and "startup ran past its limit" in result.error
    assert (
        "fork refused: [Errno 11] Resource temporarily unavailable" in log
    )  # the limit bound, not memory
    assert time.monotonic() - began < 40
    assert max(latencies) < 5.0, latencies  # another program still starts while the bomb runs
    print(
        f"fork bomb: {log.count('fork refused')} processes refused a fork; starting a program took "
        f"at most {max(latencies):.2f} s over {len(latencies)} tries"
    )


def test_secrets_in_the_runners_own_environment_stay_out_of_proc(tmp_path, small_data):
    """The runner's /proc/PID/environ holds a key; the sandbox sees no process of the host at all."""
    source = PROBE + (
        "def scan():\n    hits = []\n    for p in os.listdir('/proc'):\n        if p.isdigit():\n"
        "            try:\n                if b'sk-live' in open(f'/proc/{p}/environ', 'rb').read():\n"
        "                    hits.append(p)\n            except OSError:\n                pass\n"
        "    return hits, len([p for p in os.listdir('/proc') if p.isdigit()])\n"
        "attempt('scan', scan)\nattempt('parent', lambda: open(f'/proc/{os.getppid()}/environ', 'rb').read())\n"
    )
    (tmp_path / "train.py").write_text(source)
    child = (
        "import json, sys\nfrom pathlib import Path\nfrom node.trainer import runner, run_experiment, get_profile\n"
        "from node.trainer.data import TokenData\n"
        "runner.check_source = lambda s: []\n"
        f"data = TokenData(Path({str(small_data.root)!r}), json.loads(Path({str(small_data.root)!r}, 'manifest.json').read_text()))\n"
        f"r = run_experiment(Path({str(tmp_path / 'train.py')!r}), get_profile('test'), data, Path({str(tmp_path / 'run')!r}), sandbox=True)\n"
        "print(json.dumps(r.as_dict()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child],
        env={**os.environ, "OPENAI_API_KEY": SECRET},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "ATTEMPT scan: ok ([], " in log and "ATTEMPT parent:" in log
    visible = int(log.split("ATTEMPT scan: ok ([], ")[1].split(")")[0])
    assert visible <= 3  # bubblewrap's init and the run itself: its own process namespace
    assert SECRET not in done.stdout + "".join(
        p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*") if p.is_file()
    )


def test_the_scorer_refuses_a_graph_that_reads_files_or_keeps_state(tmp_path):
    import torch

    from node.trainer.scorer import ModelRefused, _check_graph

    class Stateful(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, idx):
            self.calls.add_(1)
            return idx.float()[..., None] * self.calls

    class Printing(torch.nn.Module):
        def forward(self, idx):
            torch.ops.aten._print("hello")
            return idx.float()[..., None]

    x = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ModelRefused, match="writes into its own weights, buffers or input"):
        _check_graph(torch.export.export(Stateful(), (x,), strict=False))
    with pytest.raises(ModelRefused, match="files or the console"):
        _check_graph(torch.export.export(Printing(), (x,), strict=False))


def test_the_harness_hash_covers_the_scorer_and_the_look_ahead_check(tmp_path, monkeypatch):
    # A copy of the trainer's files stands in for the real ones: an edit of any of the harness's
    # files changes the hash, an edit of the train.py agents edit does not.
    for path in Path(version_module.__file__).parent.glob("*.py"):
        shutil.copy(path, tmp_path / path.name)
    real = harness_sha256()
    monkeypatch.setattr(version_module, "__file__", str(tmp_path / "version.py"))
    assert harness_sha256() == real
    names = ("scorer.py", "causality.py", "harness.py", "runner.py", "process.py", "version.py")
    for name in (*names, "train.py"):
        source = (tmp_path / name).read_text()
        (tmp_path / name).write_text(source + "# an edit\n")
        assert (harness_sha256() == real) == (name == "train.py"), name
        (tmp_path / name).write_text(source)
