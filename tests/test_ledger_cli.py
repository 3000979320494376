"""`swarm keys` and `swarm ledger`, driven as a user would: tables for people, JSON for programs."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    BASELINE,
    CAMPAIGN,
    HARNESS,
    T0,
    confirming_looks,
    make_result,
    make_verification,
    set_terms,
)
from typer.testing import CliRunner

from node import committees, consensus, wire
from node.cli import app
from node.identity import Identity, load_identity
from node.ledger import Ledger, ledger_path

V1, V2 = "11" * 32, "22" * 32
runner = CliRunner()


def swarm(*args: str) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


@pytest.fixture
def home(tmp_path, alice, bob) -> Path:
    first = make_result(alice, 2, BASELINE, V1, 1.50, description="wider MLP")
    second = make_result(alice, 3, V1, V2, 1.45, description="lower learning rate")
    crash = make_result(
        bob, 1, V1, "33" * 32, None, outcome="crash", description="bigger batch", time_ms=T0 + 9000
    )
    campaign = wire.campaign_body(
        name=CAMPAIGN, organiser=alice.public_key, program=b"# program", baseline=BASELINE,
        profiles=["cpu"], quorum=1, data={"tokenizer": "ab" * 32},
    )  # fmt: skip
    with Ledger(ledger_path(tmp_path), campaign=CAMPAIGN) as book:
        set_terms(book, organiser=alice.peer_id)
        book.publish(alice, "campaign", campaign, T0)
        # The profile's first win has the looks the outlier hold asks; the second is within
        # HOLD_FACTOR of its gain, so one look verifies it.
        book.ingest_many(
            [first.raw, second.raw, crash.raw, *(f.raw for f in confirming_looks(bob, 2, first)),
             make_verification(bob, 5, second, delta=-0.03).raw, b"\x93junk"]
        )  # fmt: skip
        book.record_run(profile="cpu", outcome="keep", log_path=str(tmp_path / "runs/1/log"))
    return tmp_path


def test_keys_show_creates_the_key_once_and_prints_the_peer_id(tmp_path):
    shown = json.loads(swarm("keys", "show", "--home", str(tmp_path), "--json"))
    assert shown["created"] and shown["peer_id"].startswith("12D3KooW")
    again = json.loads(swarm("keys", "show", "--home", str(tmp_path), "--json"))
    assert not again["created"] and again["peer_id"] == shown["peer_id"]
    assert load_identity(tmp_path).public_key.hex() == shown["public_key"]
    assert shown["peer_id"] in swarm("keys", "show", "--home", str(tmp_path))


def test_keys_new_refuses_to_replace_a_key_without_force(tmp_path):
    first = json.loads(swarm("keys", "new", "--home", str(tmp_path), "--json"))["peer_id"]
    refused = runner.invoke(app, ["keys", "new", "--home", str(tmp_path)])
    assert refused.exit_code != 0 and "--force" in str(refused.exception)
    assert load_identity(tmp_path).peer_id == first
    forced = json.loads(swarm("keys", "new", "--home", str(tmp_path), "--force", "--json"))
    assert forced["peer_id"] != first and load_identity(tmp_path).peer_id == forced["peer_id"]


def test_summary_counts_what_the_ledger_holds(home):
    info = json.loads(swarm("ledger", "summary", "--home", str(home), "--json"))
    assert info["facts"] == {"campaign": 1, "result": 3, "verification": 4}
    assert info["campaigns"] == [CAMPAIGN]
    assert info["outcomes"] == {"keep": 2, "crash": 1}
    assert info["rejected"] == {"malformed": 1} and info["runs"] == 1
    text = swarm("ledger", "summary", "--db", str(ledger_path(home)))
    assert "result 3" in text and "malformed 1" in text


def test_experiments_are_newest_first_and_filter(home, bob):
    rows = json.loads(swarm("ledger", "experiments", "--home", str(home), "--json"))
    assert [r["description"] for r in rows] == ["bigger batch", "lower learning rate", "wider MLP"]
    kept = json.loads(
        swarm("ledger", "experiments", "--home", str(home), "--outcome", "keep", "--json")
    )
    assert {r["outcome"] for r in kept} == {"keep"} and len(kept) == 2
    by_bob = json.loads(
        swarm("ledger", "experiments", "--home", str(home), "--peer", bob.peer_id, "--json")
    )
    assert [r["description"] for r in by_bob] == ["bigger batch"]
    tail = bob.peer_id[-8:]  # what the tables show
    assert (
        json.loads(swarm("ledger", "experiments", "--home", str(home), "--peer", tail, "--json"))
        == by_bob
    )
    none = json.loads(
        swarm("ledger", "experiments", "--home", str(home), "--profile", "gpu", "--json")
    )
    assert none == []
    table = swarm("ledger", "experiments", "--home", str(home))
    assert "lower learning rate" in table and "1.4500" in table and V2[:12] in table


def test_leaderboard_shows_verified_versions_with_finder_and_verifiers(home, alice, bob):
    board = json.loads(swarm("ledger", "leaderboard", "--home", str(home), "--json"))
    assert [e["child"] for e in board["cpu"]] == [V2, V1]
    assert board["cpu"][0]["found_by"] == alice.peer_id
    assert board["cpu"][0]["verified_by"] == [bob.peer_id]
    assert (
        json.loads(swarm("ledger", "leaderboard", "--home", str(home), "--quorum", "2", "--json"))
        == {}
    )
    table = swarm("ledger", "leaderboard", "--home", str(home))
    assert "profile cpu" in table and "-0.0800 ± 0.0081" in table and bob.peer_id[-8:] in table


def test_void_runs_and_verdicts_and_a_held_claim_show_as_such(tmp_path, alice, bob, carol):
    scale = make_result(alice, 1, BASELINE, V1, 1.50, description="wider MLP")
    outlier = make_result(alice, 2, V1, V2, 1.00, description="too good")
    void = make_result(carol, 1, V1, "33" * 32, None, outcome="void", description="peeks ahead")
    side = make_result(alice, 3, V1, "44" * 32, 1.40, description="side")
    with Ledger(ledger_path(tmp_path), campaign=CAMPAIGN) as book:
        set_terms(book)
        book.ingest_many(
            [scale.raw, outlier.raw, void.raw, side.raw,
             *(f.raw for f in confirming_looks(bob, 1, scale)),
             make_verification(bob, 4, outlier, delta=-0.5).raw,
             make_verification(carol, 2, side, "void").raw]
        )  # fmt: skip
    home = str(tmp_path)
    info = json.loads(swarm("ledger", "summary", "--home", home, "--json"))
    assert info["outcomes"] == {"keep": 3, "void": 1}
    assert info["verdicts"] == {"confirm": 4, "void": 1}
    voided = json.loads(
        swarm("ledger", "experiments", "--home", home, "--outcome", "void", "--json")
    )
    assert [r["description"] for r in voided] == ["peeks ahead"]
    rows = {
        r["description"]: r
        for r in json.loads(swarm("ledger", "experiments", "--home", home, "--json"))
    }
    assert rows["side"]["voids"] == 1 and rows["wider MLP"]["held"] is None
    assert rows["too good"]["held"] == (
        "held: gain 0.5000 is 10x the largest verified on cpu (0.0500); "
        "needs 3 seeds from its verifiers, has 1"
    )
    assert "held: gain" in swarm("ledger", "experiments", "--home", home)
    board = json.loads(swarm("ledger", "leaderboard", "--home", home, "--json"))
    assert [e["child"] for e in board["cpu"]] == [V1]  # the held claim is no verified version
    table = swarm("ledger", "leaderboard", "--home", home)
    held_row = next(line for line in table.splitlines() if V2[:12] in line)
    assert "held" in held_row and "too good" in held_row
    peers = {
        p["peer_id"]: p for p in json.loads(swarm("ledger", "peers", "--home", home, "--json"))
    }
    assert peers[alice.peer_id]["voids"] == 1


def test_lineage_prints_the_chain_from_the_baseline(home):
    chain = json.loads(swarm("ledger", "lineage", V2[:10], "--home", str(home), "--json"))
    assert [s["child"] for s in chain] == [V1, V2]
    assert chain[1]["delta"] == pytest.approx(-0.05)
    table = swarm("ledger", "lineage", V2, "--home", str(home))
    assert "wider MLP" in table and "-0.0500" in table
    assert "from the campaign's baseline" in table


def test_peers_show_standing_and_rejections(home, alice, bob):
    peers = {
        p["peer_id"]: p for p in json.loads(swarm("ledger", "peers", "--home", str(home), "--json"))
    }
    assert peers[alice.peer_id]["results"] == 2 and peers[alice.peer_id]["confirmations"] == 4
    assert peers[alice.peer_id]["voids"] == 0
    assert peers[bob.peer_id]["verifications"] == 4
    assert peers["unknown"]["rejected"] == {"malformed": 1}
    assert alice.peer_id in swarm("ledger", "peers", "--home", str(home))


def test_show_decodes_a_fact_and_checks_its_signature(home, alice):
    fact_id = json.loads(swarm("ledger", "experiments", "--home", str(home), "--json"))[-1]["id"]
    info = json.loads(swarm("ledger", "show", fact_id[:12], "--home", str(home), "--json"))
    assert info["id"] == fact_id and info["status"] == "valid"
    assert info["envelope"]["body"]["description"] == "wider MLP"
    assert info["envelope"]["author"] == alice.public_key.hex()
    text = swarm("ledger", "show", fact_id, "--home", str(home))
    assert "valid" in text and alice.peer_id in text and "wider MLP" in text


def test_claim_shows_its_judgement_its_committee_and_why_each_look_counts_or_not(
    tmp_path, alice, bob
):
    """In a campaign with members, the looks at a claim by its committee count; a member's off
    the committee, its author's own, one with no score and one under another harness do not, and
    the claim says why of each; a result not kept claims nothing, nor does a look, and the
    error says where to look."""
    people = [Identity(bytes(range(k, k + 32))) for k in range(3, 10)]
    members = sorted({p.peer_id for p in people} | {alice.peer_id, bob.peer_id})
    win = make_result(alice, 1, BASELINE, V1, 1.40, description="wider MLP")
    lost = make_result(alice, 2, BASELINE, V2, 1.60, outcome="discard")
    with Ledger(ledger_path(tmp_path), campaign=CAMPAIGN) as book:
        set_terms(book, members=members)
        book.ingest_many([win.raw, lost.raw])
        seats = committees.panel({**win.body, "author": alice.peer_id}, book.rules("cpu"))
        by_id = {p.peer_id: p for p in [*people, bob]}
        seated = by_id[min(seats)]
        off = next(p for p in people if p.peer_id not in seats)
        elsewhere = make_verification(off, 1, win, seed=40)
        book.ingest_many([f.raw for f in (
            *confirming_looks(seated, 1, win),
            elsewhere,
            make_verification(alice, 3, win, seed=41),
            wire.sign(seated, "verification", CAMPAIGN, 9, wire.verification_body(
                result=win.id, child_val_bpb=None, parent_val_bpb=1.5, seed=42, profile="cpu",
                harness=HARNESS, verdict="crash"), T0 + 600_000),
            make_verification(seated, 10, win, harness="cd" * 32, seed=43),
        )])  # fmt: skip
    shown = json.loads(swarm("ledger", "claim", win.id[:10], "--home", str(tmp_path), "--json"))
    assert shown["result"]["id"] == win.id and shown["state"] == "verified"
    assert sorted(shown["seats"]) == sorted(seats) and shown["counted"] == [seated.peer_id]
    notes = {(v["author"], v["seed"]): (v["counts"], v["note"]) for v in shown["looks"]}
    assert notes[(seated.peer_id, 7)] == (True, "")
    assert notes[(off.peer_id, 40)] == (False, "not on its committee")
    assert notes[(alice.peer_id, 41)] == (False, "its author's own look")
    assert notes[(seated.peer_id, 42)] == (False, "no score (crash)")
    assert notes[(seated.peer_id, 43)] == (False, "run under another harness")
    assert shown["gain"] == pytest.approx(0.05) and shown["seeds"] == consensus.HOLD_LOOKS
    table = swarm("ledger", "claim", win.id[:10], "--home", str(tmp_path))
    assert "verified" in table and "not on its committee" in table and "+0.0500" in table
    refused = runner.invoke(app, ["ledger", "claim", lost.id[:10], "--home", str(tmp_path)])
    assert refused.exit_code != 0 and "was not kept (discard)" in str(refused.exception)
    refused = runner.invoke(app, ["ledger", "claim", elsewhere.id[:10], "--home", str(tmp_path)])
    assert refused.exit_code != 0 and "is no result" in str(refused.exception)


def test_export_writes_csv_and_json(home, tmp_path):
    rows = list(
        csv.DictReader(
            io.StringIO(swarm("ledger", "export", "--home", str(home), "--format", "csv"))
        )
    )
    assert len(rows) == 3 and {r["outcome"] for r in rows} == {"keep", "crash"}
    out = tmp_path / "facts.json"
    swarm("ledger", "export", "--home", str(home), "--table", "facts", "--output", str(out))
    facts = json.loads(out.read_text())
    assert len(facts) == 8 and all(len(bytes.fromhex(f["raw"])) > 100 for f in facts)


def test_every_command_explains_itself_with_an_example():
    for group, commands in (("keys", ["show", "new"]), ("ledger", ["summary", "experiments",
                            "leaderboard", "lineage", "peers", "show", "export"])):  # fmt: skip
        for command in commands:
            assert "Example: swarm" in swarm(group, command, "--help")


def test_user_mistakes_are_one_line_errors_not_tracebacks(home, tmp_path):
    cases = [
        (["ledger", "summary", "--db", str(tmp_path / "absent.db")], "no ledger at"),
        (["ledger", "show", "zz", "--home", str(home)], "not a sha256"),
        (["ledger", "show", "abcdef", "--home", str(home)], "nothing in"),
        (["ledger", "lineage", "99" * 32, "--home", str(home)], "nothing in"),
        (["ledger", "claim", "abcdef", "--home", str(home)], "nothing in"),
        (["keys", "new", "--home", str(home / "k")], None),
        (["keys", "new", "--home", str(home / "k")], "--force"),
        (["keys", "show", "--home", str(home / "ledger.db")], "is not a directory"),  # a file
        (
            ["ledger", "export", "--home", str(home), "--output", str(home / "no/such/dir.csv")],
            "cannot write",
        ),
    ]
    for args, message in cases:
        done = subprocess.run(
            [sys.executable, "-m", "node.cli", *args], capture_output=True, text=True,
            cwd=Path(__file__).parent.parent,
        )  # fmt: skip
        if message is None:
            assert done.returncode == 0, done.stderr
            continue
        assert done.returncode == 1, (args, done.stderr)
        assert "Traceback" not in done.stderr and done.stderr.startswith("error:")
        assert message in done.stderr


LONG = ("Learning-rate warm-up over the first 2% of the budget, then a cosine decay to a tenth of "
        "the peak, with the embedding's rate left alone")  # fmt: skip


def narrow(*args: str, terminal: bool) -> list[str]:
    """The lines `swarm` prints at 80 columns: to a pipe, or to a terminal of 80 columns."""
    import os
    import pty
    import re

    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    command = [sys.executable, "-m", "node.cli", *args]
    if not terminal:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()
    leader, follower = pty.openpty()
    proc = subprocess.Popen(command, stdout=follower, stderr=subprocess.DEVNULL, env=env)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower closed: the command ended
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=120) == 0
    os.close(leader)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode())
    return text.replace("\r\n", "\n").splitlines()


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_experiments_and_peers_stay_readable_at_80_columns(tmp_path, alice, bob, terminal):
    facts = [make_result(alice, 1, BASELINE, V1, 1.50, description=LONG),
             make_result(bob, 1, V1, V2, None, outcome="crash", description="bigger batch")]  # fmt: skip
    with Ledger(ledger_path(tmp_path), campaign=CAMPAIGN) as book:
        set_terms(book)
        book.ingest_many([f.raw for f in facts])
    lines = narrow("ledger", "experiments", "--home", str(tmp_path), terminal=terminal)
    assert lines and all(len(line) <= 80 for line in lines), lines
    rows = json.loads(swarm("ledger", "experiments", "--home", str(tmp_path), "--json"))
    for r in rows:  # each experiment's fields on one line of their own, none cut
        (line,) = [line for line in lines if r["child"][:12] in line]
        assert r["author"][-8:] in line and r["outcome"] in line and r["profile"] in line
        assert (f"{r['val_bpb']:.4f}" if r["val_bpb"] is not None else " - ") in line
    assert " ".join(line.strip() for line in lines).count(LONG) == 1  # wrapped at words, whole
    lines = narrow("ledger", "peers", "--home", str(tmp_path), terminal=terminal)
    assert all(len(line) <= 80 for line in lines), lines
    for who in (alice, bob):  # whole, to be pasted into --peer
        assert who.peer_id in lines
