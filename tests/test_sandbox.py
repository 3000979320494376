"""A stranger's train.py: refused by the static policy, or contained by the sandbox when it slips past."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from node.trainer import BASELINE_TRAIN_PY, get_profile, run_experiment
from node.trainer.policy import check_source
from node.trainer.sandbox import (
    bwrap_command,
    clean_environment,
    limit_resources,
    sandbox_uid,
)

HEAD = "import torch\nfrom node.trainer.harness import session\nS = session()\n"

# Each attack is a realistic way for a train.py to reach outside its job; the policy must refuse it.
ATTACKS = {
    "imports os to read the key file": "import os\nos.system('cat ~/.research-swarm/identity.key')\n",
    "opens the ledger": "db = open('/root/.research-swarm/ledger.db', 'rb').read()\n",
    "opens a socket": "import socket\nsocket.create_connection(('127.0.0.1', 80))\n",
    "fetches a URL": "import urllib.request\nurllib.request.urlopen('http://127.0.0.1/')\n",
    "spawns a subprocess": "import subprocess\nsubprocess.run(['sh', '-c', 'id'])\n",
    "reads API keys from the environment": "from os import environ\nkey = environ['OPENAI_API_KEY']\n",
    "escapes through ctypes": "import ctypes\nctypes.CDLL(None).system(b'id')\n",
    "imports by name": "os = __import__('os')\n",
    "evaluates a string": "eval(\"__import__('os').system('id')\")\n",
    "executes a string": "exec('import os')\n",
    "compiles code": "code = compile('1', 'x', 'eval')\n",
    "reaches builtins through getattr": "f = getattr(__builtins__, 'open')\n",
    "walks subclasses to find a loader": "loaders = ().__class__.__base__.__subclasses__()\n",
    "unpickles with torch.load": "state = torch.load('/tmp/evil.pt')\n",
    "writes with torch.save": "torch.save({}, '/root/outside.pt')\n",
    "loads native code": "torch.ops.load_library('/tmp/evil.so')\n",
    "builds a C++ extension": "from torch.utils.cpp_extension import load_inline\n",
    "uses torch's process pool": "import torch.multiprocessing as mp\nmp.spawn(print)\n",
    "downloads from the hub": "model = torch.hub.load('repo', 'model')\n",
    "stops the harness clock": "S._clock_start = None\n",
    "stretches the budget": "S._SESSION = None\n",
    "takes the harness's internals": "from node.trainer.harness import evaluate_bpb\n",
    "imports the harness module": "from node.trainer import harness\nharness.evaluate_bpb = lambda *a, **k: {'val_bpb': 0.1}\n",
    "pickles": "import pickle\npickle.loads(b'')\n",
    "reads globals": "g = globals()\n",
    "fork bomb through os": "import os\nwhile True:\n    os.fork()\n",
    "forges a score file": "import json\njson.dump({'val_bpb': 0.01}, open('result.json', 'w'))\n",
    "lifts the GPU memory cap": "torch.cuda.set_per_process_memory_fraction(1.0)\n",
    "swaps in its own GPU allocator": "torch.cuda.memory.change_current_allocator(None)\n",
}


def test_the_baseline_passes_the_policy():
    assert check_source(BASELINE_TRAIN_PY.read_text()) == []


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_the_policy_refuses_each_attack(name):
    violations = check_source(HEAD + ATTACKS[name])
    assert violations, f"the policy let through: {name}"
    assert all(v.line >= 4 for v in violations)  # the offence, not the allowed header, is named


def test_oversized_and_unparsable_versions_are_refused():
    assert "limits" in str(check_source("x = 1\n" * 20000)[0])
    assert "does not parse" in str(check_source("def broken(:\n")[0])


def test_train_py_is_parsed_one_thread_at_a_time():
    """CPython 3.11's `ast.parse` shares one depth counter between threads (a SystemError when
    two runs of a node's workers were checked at once, seen in CI): the policy's and the offline
    proposer's parses take one lock."""
    from node.agent.offline import OfflineProposer
    from node.trainer import policy

    fresh = BASELINE_TRAIN_PY.read_text() + f"# {os.urandom(8).hex()}\n"  # in no cache
    for parse in (
        lambda: check_source(fresh),
        lambda: list(OfflineProposer(0).candidates(fresh, "test")),
    ):
        done = threading.Event()
        with policy._PARSING:
            waiting = threading.Thread(target=lambda p=parse, d=done: (p(), d.set()))
            waiting.start()
            assert not done.wait(0.3)  # held while another thread parses
        assert done.wait(10)
        waiting.join()


def test_a_refused_version_never_runs_and_its_result_says_why(tmp_path, small_data):
    script = tmp_path / "train.py"
    script.write_text(HEAD + ATTACKS["spawns a subprocess"])
    result = run_experiment(script, get_profile("test"), small_data, tmp_path / "run")
    assert result.outcome == "crash" and result.val_bpb is None
    assert result.error.startswith("refused by the policy: line 4: import of 'subprocess'")
    assert not (tmp_path / "run" / "log.txt").exists()  # no process was started
    assert json.loads((tmp_path / "run" / "result.json").read_text())["error"] == result.error


# ---------------------------------------------------------------------------------------------
# The sandbox, tested on its own: a program that got past the policy tries everything at once.

PROBE = r"""
import json, os, socket, sys
home, outside, data, port = sys.argv[1:5]
found = {}
def attempt(name, action):
    try:
        found[name] = repr(action())[:80]
    except BaseException as exc:
        found[name] = "blocked: " + type(exc).__name__
attempt("read_key", lambda: open(os.path.join(home, "identity.key"), "rb").read())
attempt("list_home", lambda: os.listdir(home))
attempt("connect", lambda: socket.create_connection(("127.0.0.1", int(port)), timeout=2).close())
attempt("write_outside", lambda: open(os.path.join(outside, "planted.txt"), "w").write("x"))
attempt("write_data", lambda: open(data, "ab").write(b"x"))
attempt("write_workdir", lambda: open("scratch.txt", "w").write("ok"))
found["secret_in_env"] = "OPENAI_API_KEY" in os.environ
found["secret_in_proc"] = any(b"sk-secret" in open(f"/proc/{p}/environ", "rb").read()
                              for p in os.listdir("/proc") if p.isdigit() and os.access(f"/proc/{p}/environ", os.R_OK))
found["pids_visible"] = len([p for p in os.listdir("/proc") if p.isdigit()])
print(json.dumps(found))
"""


def _accept_into(server: socket.socket, accepted: list) -> None:
    try:
        accepted.append(server.accept())
    except OSError:
        pass


@pytest.mark.sandbox
def test_the_sandbox_contains_a_program_that_slipped_past_the_policy(
    tmp_path, small_data, monkeypatch
):
    home, outside, work = tmp_path / "home", tmp_path / "outside", tmp_path / "run"
    for folder in (home, outside, work):
        folder.mkdir()
    (home / "identity.key").write_bytes(b"secret key bytes")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    server = socket.create_server(("127.0.0.1", 0))
    accepted = []
    server.settimeout(
        60
    )  # closed at the end of the test: the thread then ends with an OSError it ignores
    threading.Thread(target=_accept_into, args=(server, accepted), daemon=True).start()
    (work / "probe.py").write_text(PROBE)
    cmd = bwrap_command(
        [
            sys.executable,
            str(work / "probe.py"),
            str(home),
            str(outside),
            str(small_data.val_path),
            str(server.getsockname()[1]),
        ],
        work,
        [small_data.val_path],
        "cpu",
    )
    done = subprocess.run(
        cmd,
        env=clean_environment({"HOME": str(work)}),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: limit_resources("cpu"),
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    server.close()
    for attempt in ("read_key", "list_home", "connect", "write_outside", "write_data"):
        assert found[attempt].startswith("blocked"), (attempt, found[attempt])
    assert found["write_workdir"] == "2"  # its own working directory is writable
    assert not found["secret_in_env"] and not found["secret_in_proc"]
    assert found["pids_visible"] <= 3  # its own process namespace
    assert not accepted and not list(outside.iterdir())
    assert os.environ["OPENAI_API_KEY"] == "sk-secret"


@pytest.mark.sandbox
@pytest.mark.slow
def test_an_honest_run_inside_the_sandbox_scores_like_one_outside(tmp_path, small_data):
    profile = get_profile("test")
    inside = run_experiment(
        BASELINE_TRAIN_PY, profile, small_data, tmp_path / "in", seed=3, sandbox=True
    )
    outside = run_experiment(
        BASELINE_TRAIN_PY, profile, small_data, tmp_path / "out", seed=3, sandbox=False
    )
    assert inside.outcome == outside.outcome == "ok"
    assert inside.sandboxed and not outside.sandboxed
    # Bit for bit: a CPU run is a function of its code, seed, budget and data (one thread sums in
    # one order: test_determinism), and the sandbox changes where files are and who runs, never
    # the arithmetic. Seeds 3 and 4 scored the same to the last bit inside and out (2026-12-03).
    assert inside.val_bpb == outside.val_bpb
    assert (inside.steps, inside.tokens) == (outside.steps, outside.tokens)


@pytest.mark.slow
def test_a_model_that_looks_at_future_tokens_is_refused_not_scored(tmp_path, small_data):
    peeking = BASELINE_TRAIN_PY.read_text().replace("is_causal=True", "is_causal=False")
    assert (
        peeking != BASELINE_TRAIN_PY.read_text() and check_source(peeking) == []
    )  # it passes the policy
    script = tmp_path / "train.py"
    script.write_text(peeking)
    profile = get_profile("test")
    result = run_experiment(script, profile, small_data, tmp_path / "run")
    assert result.outcome == "void" and result.val_bpb is None
    assert result.error.startswith("refused by the harness: the model looks ahead")


@pytest.mark.sandbox
@pytest.mark.skipif(
    sandbox_uid() is None, reason="needs a root node, which runs its sandbox as a uid of its own"
)
def test_the_sandbox_uid_reads_the_system_files_it_is_given():
    # Triton finds libcuda with `ldconfig -p`, which reads /etc/ld.so.cache: a GPU run dies
    # at its first compile when the sandbox's uid cannot reach /etc.
    cmd = bwrap_command(["/bin/sh", "-c", "/sbin/ldconfig -p >/dev/null && cat /etc/passwd"], None, [], "cpu",
                        sandbox_uid())  # fmt: skip
    done = subprocess.run(
        cmd, env=clean_environment({}), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "root:" in done.stdout
