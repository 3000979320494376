"""Campaign files: made and signed by an organiser, checked on every load, joined from a file or
fetched by hash from a bootstrap that serves it; a file that was changed never loads."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from conftest import Process, make_result, run_swarm

from node import wire
from node.campaign import (
    CampaignError,
    budget_warning,
    check_data,
    load_campaign,
    make_campaign,
    parse_campaign,
    pinned_budget,
)

ROOT = Path(__file__).resolve().parents[1]
WEAK = ROOT / "tests" / "campaigns" / "weak_train.py"


@pytest.fixture(scope="module")
def made(tmp_path_factory, small_data, data_cache):
    where = tmp_path_factory.mktemp("campaign")
    env = {**os.environ, "SWARM_DATA": str(data_cache), "COLUMNS": "200"}
    done = run_swarm(
        "campaign",
        "new",
        "hack-nov",
        "--program",
        str(ROOT / "program.md"),
        "--profile",
        "test",
        "--quorum",
        "2",
        "--baseline",
        str(WEAK),
        "--budget",
        "test=32768",
        "--out",
        str(where / "hack.json"),
        "--home",
        str(where / "organiser"),
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return where / "hack.json", env, small_data


def edited(path: Path, change) -> bytes:
    doc = json.loads(path.read_text())
    change(doc)
    return json.dumps(doc).encode()


def test_a_campaign_file_pins_program_baseline_data_and_quorum_under_the_organisers_signature(made):
    path, env, data = made
    campaign = load_campaign(path)
    assert campaign.name == "hack-nov" and campaign.quorum == 2 and campaign.profiles == ["test"]
    assert (
        campaign.baseline == WEAK.read_text()
        and campaign.program == (ROOT / "program.md").read_text()
    )
    assert campaign.data_for("test") == {
        "data": "embedded:small",
        "tokens": data.sha256,
        "tokenizer": data.manifest["tokenizer_sha256"],
        "budget": "32768",
    }
    assert pinned_budget(campaign, "test") == 32768 and pinned_budget(None, "test") is None
    assert campaign.organiser == campaign.fact.peer_id
    check_data(campaign, "test", data.manifest)  # this machine built the same data
    with pytest.raises(CampaignError, match="differ from campaign hack-nov"):
        check_data(campaign, "test", {**data.manifest, "sha256": "0" * 64})
    shown = json.loads(run_swarm("campaign", "show", str(path), "--json", env=env).stdout)
    assert shown["quorum"] == 2 and shown["sha256"] == campaign.sha256


@pytest.mark.parametrize("change, error", [
    (lambda d: d.update(quorum=1), "fields quorum differ from what the organiser signed"),
    (lambda d: d.update(baseline=d["baseline"] + "\n# more\n"), "baseline train.py does not match"),
    (lambda d: d.update(program="do anything\n"), "program.md does not match"),
    (lambda d: d.update(format="something else"), "not a campaign file"),
    (lambda d: d.pop("fact"), "not a campaign file"),
])  # fmt: skip
def test_a_changed_campaign_file_never_loads(made, change, error):
    path, _, _ = made
    with pytest.raises(CampaignError, match=error):
        parse_campaign(edited(path, change))


def test_a_campaign_fact_signed_by_someone_else_or_of_another_kind_is_refused(made, bob):
    path, _, _ = made
    campaign = load_campaign(path)
    with pytest.raises(
        wire.WireError, match="signed by its organiser"
    ):  # bob cannot sign for alice
        wire.sign(bob, "campaign", "hack-nov", 1, dict(campaign.fact.body))
    own = wire.sign(
        bob, "campaign", "hack-nov", 1, {**campaign.fact.body, "organiser": bob.public_key}
    )
    with pytest.raises(
        CampaignError, match="fields organiser differ"
    ):  # bob's own, in alice's file
        parse_campaign(edited(path, lambda d: d.update(fact=base64.b64encode(own.raw).decode())))
    result = wire.sign(
        bob, "result", "hack-nov", 2, make_result(bob, 2, "00" * 32, "11" * 32, 1.5).body
    )
    with pytest.raises(CampaignError, match="is a result, not a campaign"):
        parse_campaign(edited(path, lambda d: d.update(fact=base64.b64encode(result.raw).decode())))
    tampered = bytearray(campaign.fact.raw)
    tampered[-1] ^= 1  # the signature's last byte
    with pytest.raises(CampaignError, match="refused"):
        parse_campaign(
            edited(path, lambda d: d.update(fact=base64.b64encode(bytes(tampered)).decode()))
        )


def test_bad_campaign_arguments_are_one_line_errors(made, tmp_path):
    path, env, _ = made
    missing = run_swarm(
        "join", "--campaign", str(tmp_path / "nope.json"), "--home", str(tmp_path / "h"), env=env
    )
    assert (
        missing.returncode == 1
        and "no campaign file" in missing.stderr
        and len(missing.stderr.splitlines()) == 1
    )
    wrong = run_swarm(
        "join", "--campaign", str(path), "--profile", "cpu", "--home", str(tmp_path / "h"), env=env
    )
    assert wrong.returncode == 1 and "runs on test, not cpu" in wrong.stderr
    quorum = run_swarm(
        "join", "--campaign", str(path), "--quorum", "1", "--home", str(tmp_path / "h"), env=env
    )
    assert quorum.returncode == 1 and "sets quorum 2" in quorum.stderr
    bare = run_swarm(
        "join", "--campaign", "sha256:" + "ab" * 32, "--home", str(tmp_path / "h"), env=env
    )
    assert bare.returncode == 1 and "needs --bootstrap" in bare.stderr
    baseline = tmp_path / "bad.py"
    baseline.write_text("import os\nos.system('true')\n")

    def new_campaign(*options: str):
        return run_swarm("campaign", "new", "x", "--program", str(ROOT / "program.md"),
                         "--profile", "test", *options, "--home", str(tmp_path / "o"), env=env)  # fmt: skip

    refused = new_campaign("--baseline", str(baseline))
    assert refused.returncode == 1 and "breaks the train.py policy" in refused.stderr
    for bad in ("cpu=1000", "test=lots", "test"):
        budget = new_campaign("--budget", bad)
        assert budget.returncode == 1 and "expected PROFILE=TOKENS" in budget.stderr, budget.stderr
        assert len(budget.stderr.strip().splitlines()) == 1


def test_a_budget_that_reads_the_data_more_than_four_times_is_named_with_the_two_ways_out():
    manifest = {"data": "embedded:default", "train_tokens": 25_168_575}
    said = budget_warning("gpu", 503_316_480, manifest, "--budget gpu={budget}")
    assert said == (
        "gpu: a budget of 503,316,480 tokens reads the 25,168,575 training tokens of embedded:default "
        "20.0 times, so val_bpb will measure memorising more than learning: give it more data "
        "(--data web:fineweb-edu, or urls:FILE) or a smaller budget (--budget gpu=100674300)"
    )
    assert (
        budget_warning("gpu", 100_663_296, manifest, "--budget gpu={budget}") is None
    )  # 4.0 reads
    assert budget_warning("gpu", 503_316_480, {}, "--budget gpu={budget}") is None  # not counted


def test_a_campaign_fixes_its_budget_to_suit_its_data_and_says_when_it_reads_it_too_often(
    made, tmp_path
):
    """`--budget` pins a budget that suits the data in silence; one that reads the training split
    more than four times is pinned too (the organiser decides), with one line saying so when the
    campaign is made and again when a node joins it."""
    _, env, data = made
    train = data.manifest["train_tokens"]

    def new_campaign(name: str, budget: int):
        return run_swarm("campaign", "new", name, "--program", str(ROOT / "program.md"), "--profile", "test",
                         "--budget", f"test={budget}", "--out", str(tmp_path / f"{name}.json"),
                         "--home", str(tmp_path / "organiser"), env=env)  # fmt: skip

    fits = new_campaign("fits", 4 * train)
    assert fits.returncode == 0 and "reads the" not in fits.stderr, fits.stderr
    over = new_campaign("over", 5 * train)
    said = [line for line in over.stderr.splitlines() if "reads the" in line]
    assert over.returncode == 0 and len(said) == 1, over.stderr
    assert (
        f"test: a budget of {5 * train:,} tokens reads the {train:,} training tokens of "
        "embedded:small 5.0 times"
        in said[0]
        and f"--budget test={4 * train})" in said[0]
    )
    assert pinned_budget(load_campaign(tmp_path / "over.json"), "test") == 5 * train
    node = Process("join", "--campaign", str(tmp_path / "over.json"), "--profile", "test", "--listen",
                   "/ip4/127.0.0.1/tcp/0", "--no-sandbox", "--home", str(tmp_path / "member"), env=env)  # fmt: skip
    try:
        node.wait_for(
            r"test: a budget of [\d,]+ tokens reads the [\d,]+ training tokens of embedded:small 5\.0 "
            r"times, so val_bpb will measure memorising more than learning: give it more data "
            r"\(--data web:fineweb-edu, or urls:FILE\) or a smaller budget \(a campaign that pins it: "
            rf"swarm campaign new --budget test={4 * train}\)",
            120,
        )
        node.wait_for(
            rf"node \w+: campaign over, profile test, .*, {5 * train} training tokens a run", 60
        )
    finally:
        assert node.stop() == 0


def test_a_campaign_file_that_pins_a_budget_of_no_tokens_is_refused_in_one_line(
    made, tmp_path, bob
):
    path, env, _ = made
    campaign = load_campaign(path)
    pins = {**campaign.fact.body["data"], "test.budget": "0"}
    body = {**campaign.fact.body, "organiser": bob.public_key, "name": "zero", "data": pins}
    fact = wire.sign(bob, "campaign", "zero", 1, body)
    zero = tmp_path / "zero.json"
    zero.write_bytes(make_campaign(fact, campaign.program, campaign.baseline).to_bytes())
    joined = run_swarm("join", "--campaign", str(zero), "--profile", "test", "--no-sandbox", "--home",
                       str(tmp_path / "h"), env=env)  # fmt: skip
    lines = [line for line in joined.stderr.splitlines() if line.strip()]
    assert joined.returncode == 1 and len(lines) == 1, joined.stderr
    assert (
        "campaign zero pins the budget '0' for test: expected a positive number of tokens"
        in lines[0]
    )


@pytest.mark.sandbox  # a node runs peers' code only in the sandbox
def test_a_bootstrap_serves_its_campaign_file_and_a_newcomer_joins_it_by_hash(made, tmp_path):
    path, env, _ = made
    campaign = load_campaign(path)
    boot = Process(
        "bootstrap",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--campaign",
        str(path),
        "--home",
        str(tmp_path / "bootstrap"),
        env=env,
    )
    node = None
    try:
        boot.wait_for(f"sha256:{campaign.sha256}", 60)
        address = boot.wait_for(r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)", 60).group(1)
        node = Process(
            "join",
            "--bootstrap",
            address,
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--profile",
            "test",
            "--campaign",
            f"sha256:{campaign.sha256}",
            "--home",
            str(tmp_path / "newcomer"),
            env=env,
        )
        # The campaign's budget, not the profile's own, for every member.
        node.wait_for(
            r"node \w+: campaign hack-nov, profile test, .*, 32768 training tokens a run", 120
        )
        kept = tmp_path / "newcomer" / "campaigns" / f"{campaign.sha256}.campaign.json"
        assert load_campaign(kept).fact.id == campaign.fact.id
        wrong = run_swarm(
            "join",
            "--bootstrap",
            address,
            "--campaign",
            "sha256:" + "cd" * 32,
            "--home",
            str(tmp_path / "other"),
            env=env,
        )
        assert wrong.returncode == 1 and "did not serve" in wrong.stderr
    finally:
        codes = [p.stop() for p in (node, boot) if p is not None]
    assert codes == [0, 0]


def test_a_campaign_with_members_lists_them_signed_and_a_node_judges_by_its_committees(
    made, tmp_path, alice, bob, carol
):
    """`--members FILE`: the member peer ids, the organiser among them, signed into the fact; a
    wrong id or too few members for the quorum is a one-line error; the ledger of a node that
    joined judges every claim by committees drawn from them."""
    from node.identity import Identity, load_identity
    from node.ledger import Ledger

    _, env, _ = made
    team = tmp_path / "team.txt"
    team.write_text(f"{alice.peer_id}  # alice\n{bob.peer_id}\n\n{carol.peer_id}\n")
    out, home = tmp_path / "members.json", tmp_path / "organiser"
    args = ["campaign", "new", "team", "--program", str(ROOT / "program.md"), "--profile", "test",
            "--quorum", "2", "--baseline", str(WEAK), "--home", str(home), "--out", str(out)]  # fmt: skip
    done = run_swarm(*args, "--members", str(team), env=env)
    assert done.returncode == 0, done.stderr
    campaign = load_campaign(out)
    organiser = load_identity(home).peer_id
    assert campaign.members == sorted({alice.peer_id, bob.peer_id, carol.peer_id, organiser})
    assert json.loads(out.read_text())["members"] == campaign.members  # readable, and checked
    shown = run_swarm("campaign", "show", str(out), "--json", env=env)
    assert json.loads(shown.stdout)["members"] == campaign.members
    team.write_text("12D3KooWnotapeerid\n")
    bad = run_swarm(*args, "--members", str(team), env=env)
    assert (
        bad.returncode != 0 and "is not a peer id" in bad.stderr and "Traceback" not in bad.stderr
    )
    team.write_text(f"{alice.peer_id}\n")  # alice and the organiser: one verifier for quorum 2
    few = run_swarm(*args, "--members", str(team), env=env)
    assert few.returncode != 0 and "cannot reach quorum 2" in few.stderr

    with Ledger(tmp_path / "ledger.db", campaign="team") as book:
        book.set_terms(campaign.terms)
        rules = book.rules("test")
        assert rules.members == frozenset(campaign.members) and rules.quorum == 2
        body = make_result(alice, 1, campaign.baseline_sha256, "11" * 32, 1.4, profile="test").body
        claim = wire.sign(alice, "result", "team", 1, body)
        assert book.ingest(claim.raw) == claim
        from node.committees import committee, draw_of

        drawn = draw_of({"parent": claim.body["parent"], "author": alice.peer_id})
        panel = committee(drawn, alice.peer_id, rules.members, rules.committee_size)
        assert alice.peer_id not in panel and len(panel) == 3  # the three other members
        stranger = Identity(bytes(range(9, 41)))
        body = wire.verification_body(result=claim.id, child_val_bpb=1.0, parent_val_bpb=1.5, seed=1,
                                      profile="test", harness=claim.body["harness"], verdict="confirm")  # fmt: skip
        for seed in range(8):
            book.ingest(
                wire.sign(stranger, "verification", "team", seed + 1, {**body, "seed": seed}).raw
            )
        assert book.rows("SELECT state, seeds FROM claims") == [{"state": "open", "seeds": 0}]
        for k, who in enumerate((bob, carol)):  # two of its committee, each on seeds of its own
            for seed in range(2):
                book.ingest(
                    wire.sign(
                        who, "verification", "team", seed + 1, {**body, "seed": 2 * k + seed}
                    ).raw
                )
        assert book.rows("SELECT state, seeds FROM claims") == [{"state": "verified", "seeds": 4}]


@pytest.mark.slow  # six swarm commands: about 13 s
def test_the_organiser_invites_a_member_later_and_only_claims_made_since_count_its_looks(
    made, tmp_path, alice, bob, carol
):
    """`swarm campaign invite FILE PEER`: an invitation the organiser signs, gossiped as a fact;
    a node counts the invitee a member for claims made from the invitation's time on (a claim
    made before keeps its committee), judges those again when the invitation comes late, and
    refuses an invitation anyone else signed. Wrong uses are one-line errors."""
    import sqlite3

    from node.identity import load_identity
    from node.ledger import Ledger

    open_file, env, _ = made
    team = tmp_path / "team.txt"
    team.write_text(f"{alice.peer_id}\n{bob.peer_id}\n")
    out, home = tmp_path / "team.json", tmp_path / "organiser"
    done = run_swarm("campaign", "new", "team", "--program", str(ROOT / "program.md"), "--profile",
                     "test", "--quorum", "1", "--baseline", str(WEAK), "--home", str(home), "--out",
                     str(out), "--members", str(team), env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    campaign, organiser = load_campaign(out), load_identity(home)
    invited = run_swarm("campaign", "invite", str(out), carol.peer_id, "--home", str(home), env=env)
    assert invited.returncode == 0, invited.stderr
    assert f"invited {carol.peer_id} into team" in invited.stdout
    with sqlite3.connect(home / "ledger.db") as conn:
        raw, since = conn.execute(
            "SELECT raw, time FROM facts WHERE kind = 'invitation'"
        ).fetchone()
    shown = run_swarm("campaign", "show", str(out), "--json", "--home", str(home), env=env)
    assert json.loads(shown.stdout)["invited"] == [carol.peer_id], shown.stderr

    for args, said in (
        ((str(out), bob.peer_id), "is a member already"),
        ((str(out), "12D3KooWnotapeerid"), "is not a peer id"),
        ((str(open_file), carol.peer_id), "is open"),
    ):
        bad = run_swarm("campaign", "invite", *args, "--home", str(home), env=env)
        assert bad.returncode != 0 and said in bad.stderr and "Traceback" not in bad.stderr, (
            bad.stderr
        )
    (tmp_path / "other").mkdir()
    load_identity(tmp_path / "other")
    stranger = run_swarm("campaign", "invite", str(out), carol.peer_id, "--home",
                         str(tmp_path / "other"), env=env)  # fmt: skip
    assert stranger.returncode != 0 and "only campaign team's organiser" in stranger.stderr

    with Ledger(tmp_path / "node.db", campaign="team") as book:  # a member's node
        book.set_terms(campaign.terms)

        def claim(seq: int, at: int) -> wire.Fact:
            body = make_result(alice, seq, campaign.baseline_sha256, f"{seq:02d}" * 32, 1.4,
                               profile="test").body  # fmt: skip
            fact = wire.sign(alice, "result", "team", seq, body, at)
            assert book.ingest(fact.raw, now_ms=since) == fact
            return fact

        before, after = claim(1, since - 1000), claim(2, since + 1000)
        look = {"child_val_bpb": 1.0, "parent_val_bpb": 1.5, "profile": "test",
                "harness": before.body["harness"], "verdict": "confirm"}  # fmt: skip
        seq = 0
        for result in (before, after):  # carol looks at both before her invitation arrives
            for seed in range(4):
                seq += 1
                body = wire.verification_body(result=result.id, seed=seed, **look)
                book.ingest(
                    wire.sign(carol, "verification", "team", seq, body, since).raw, now_ms=since
                )
        states = "SELECT id, state, seeds FROM claims ORDER BY id"
        assert {r["state"] for r in book.rows(states)} == {"open"}  # carol is nobody yet

        forged = wire.sign(bob, "invitation", "team", 1, {"member": carol.public_key}, since)
        refused = book.ingest(forged.raw, now_ms=since)
        assert isinstance(refused, wire.Rejection) and refused.reason is wire.Reason.impostor
        assert book.rules("test").invited == ()
        with Ledger(tmp_path / "bootstrap.db", campaign="team") as relay:  # knows no organiser
            assert (
                relay.ingest(forged.raw, now_ms=since) == forged
            )  # kept and relayed, counts nowhere

        assert book.ingest(raw, now_ms=since).id == wire.decode(raw).id  # the organiser's
        rules = book.rules("test")
        assert rules.invited == ((carol.peer_id, since),)
        assert rules.members_for(before.body | {"time": before.time}) == frozenset(campaign.members)
        assert carol.peer_id in rules.members_for(after.body | {"time": after.time})
        judged = {r["id"]: (r["state"], r["seeds"]) for r in book.rows(states)}
        assert judged[before.id] == ("open", 0)  # made before she was invited: not her claim
        assert judged[after.id] == ("verified", 4), judged  # judged again when the invitation came
    assert organiser.peer_id in campaign.members
