"""Proposers: the offline one's seeded changes, and the LLM path end to end through litellm
against a real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions API."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from node.agent.errors import ModelError, ProposalRefused, SpendingLimitReached
from node.agent.llm import LLMProposer, build_messages, extract_change, rules_text
from node.agent.offline import OfflineProposer, unread_constants
from node.agent.patch import apply_diff, change_hash, make_diff
from node.agent.proposers import Attempt, Context, Proposal
from node.trainer import BASELINE_TRAIN_PY, policy

BASELINE = BASELINE_TRAIN_PY.read_text()
PROGRAM = "# program.md\nImprove val_bpb within the budget."
GOOD_CHILD = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
GOOD_DIFF = make_diff(BASELINE, GOOD_CHILD)
GOOD_REPLY = f"Description: a narrower MLP, more steps\n\n```diff\n{GOOD_DIFF}```\n"


# ---------------------------------------------------------------------------------------------
# Offline


def test_offline_proposals_compile_and_differ_from_their_parent():
    proposer, context = OfflineProposer(seed=3), Context(BASELINE, PROGRAM, "test")
    hashes = set()
    for _ in range(25):
        proposal = proposer.propose(context)
        assert proposal.source != BASELINE
        compile(proposal.source, "train.py", "exec")
        assert apply_diff(BASELINE, make_diff(BASELINE, proposal.source)) == proposal.source
        hashes.add(change_hash(BASELINE, proposal.source))
        assert "\n" not in proposal.description and proposal.description
    assert len(hashes) == 25  # never the same change twice


def test_every_offline_candidate_passes_the_train_py_policy():
    children = [child for _, child in OfflineProposer(0).candidates(BASELINE, "gpu")]
    assert len(children) > 100
    singles_and_some_pairs = children[:80]  # the pairs only combine the singles' lines
    assert all(policy.check_source(child) == [] for child in singles_and_some_pairs)


def test_offline_proposer_is_deterministic_for_a_seed_and_varies_across_seeds():
    context = Context(BASELINE)

    def first(seed: int, n: int = 10) -> list[str]:
        proposer = OfflineProposer(seed)
        return [proposer.propose(context).source for _ in range(n)]

    assert first(7) == first(7)
    assert first(7) != first(8)


def test_offline_proposer_never_proposes_an_already_tried_change():
    everything = [
        change_hash(BASELINE, child)
        for _, child in OfflineProposer(0).candidates(BASELINE, "test")
        if child != BASELINE
    ]
    tried = frozenset(everything[:-1])  # all but one: only that one may come out
    proposal = OfflineProposer(0).propose(Context(BASELINE, tried=tried))
    assert change_hash(BASELINE, proposal.source) == everything[-1]
    with pytest.raises(ProposalRefused, match="tried every change"):
        OfflineProposer(0).propose(Context(BASELINE, tried=frozenset(everything)))


def test_a_peers_discard_of_every_change_leaves_its_changes_to_run_again_not_nothing():
    """One key signed a discard of every change on the parent, each a plausible loss: the
    proposer has nothing untried, and runs the peer's discards again (`Proposal.rerun`), each
    once by this node, never a change this node ran itself or one that ran AGAIN_RUNS times."""
    candidates = [(d, c) for d, c in OfflineProposer(0).candidates(BASELINE, "test")
                  if c != BASELINE]  # fmt: skip

    def discard(description: str, child: str, by: str = "12D3KooWjammer") -> Attempt:
        return Attempt(description, "discard", 0.004, change_hash(BASELINE, child), by,
                       paired=(0.004,))  # fmt: skip

    jammed = tuple(discard(d, c) for d, c in candidates)
    proposer, rerun = OfflineProposer(0), []
    for _ in range(5):
        proposal = proposer.propose(Context(BASELINE, history=jammed, me="12D3KooWme"))
        assert proposal.rerun and "; " not in proposal.description
        rerun.append(proposal.source)
    assert len(set(rerun)) == 5  # each once
    singles = [(d, c) for d, c in candidates if "; " not in d]
    mine = tuple(discard(d, c, "this node") for d, c in singles)
    with pytest.raises(ProposalRefused, match="tried every change"):
        OfflineProposer(0).propose(Context(BASELINE, history=jammed + mine, me="12D3KooWme"))
    thrice = jammed + tuple(discard(d, c, f"12D3KooWpeer{k}") for d, c in singles for k in (1, 2))
    with pytest.raises(ProposalRefused, match="tried every change"):
        OfflineProposer(0).propose(Context(BASELINE, history=thrice, me="12D3KooWme"))


def test_offline_proposer_skips_changes_in_the_history_of_peers():
    first = OfflineProposer(5).propose(Context(BASELINE))
    seen = Attempt(
        "peer's try", "discard", 0.001, change_hash(BASELINE, first.source), "12D3KooWpeer"
    )
    second = OfflineProposer(5).propose(Context(BASELINE, history=(seen,)))
    assert second.source != first.source


def test_offline_proposer_steps_no_constant_a_run_scored_exactly_as_its_parent():
    """LOSS_CHUNKS is read only by the gpu recipe: once one step of it scored as its parent on
    every seed this node ran or looked at, no other step of it (alone or in a pair) is
    proposed; a step that moved the score closes nothing, nor does a peer's word alone: one
    key that signed no difference for a step of every constant would close them all."""

    def proposals(history: tuple[Attempt, ...]) -> list[str]:
        proposer, out = OfflineProposer(3), []
        context = Context(BASELINE, profile="demo", history=history)
        for _ in range(150):
            out.append(proposer.propose(context).description)
        return out

    unseen = Attempt("LOSS_CHUNKS 4 -> 3", "discard", 0.0, "h1", "this node", paired=(0.0, 0.0))
    moved = Attempt("HEAD_LR 0.004 -> 0.002", "discard", 0.01, "h2", "12D3KooWpeer", paired=(0.01,))
    before, after = proposals(()), proposals((unseen, moved))
    assert any("LOSS_CHUNKS" in d for d in before) and any("HEAD_LR" in d for d in before)
    assert not any("LOSS_CHUNKS" in d for d in after)
    assert any("HEAD_LR" in d for d in after)
    peers = dataclasses.replace(unseen, by="12D3KooWpeer")
    assert unread_constants(Context(BASELINE, history=(unseen,))) == {"LOSS_CHUNKS"}
    assert unread_constants(Context(BASELINE, history=(peers,))) == set()  # its word alone
    looked = dataclasses.replace(peers, looked=(0.0,))  # this node's own look agrees
    assert unread_constants(Context(BASELINE, history=(looked,))) == {"LOSS_CHUNKS"}


def test_offline_proposer_steps_the_model_size_of_its_own_profile_only():
    children = [child for _, child in OfflineProposer(0).candidates(BASELINE, "cpu")]
    rows = {line for child in children for line in child.split("\n") if line.startswith('    "')}
    assert '    "cpu": (5, 128, 64, 16, 1),' in rows  # one layer deeper
    assert '    "cpu": (4, 192, 64, 16, 1),' in rows  # one head wider
    assert '    "cpu": (4, 128, 48, 16, 1),' not in rows  # the width stays whole heads
    assert all(row.startswith('    "cpu"') or row in BASELINE for row in rows)
    assert not any("(5, 128, 64, 16, 1)" in c for _, c in OfflineProposer(0).candidates(BASELINE))


def test_offline_proposer_steps_capital_constants_of_an_edited_parent():
    parent = BASELINE.replace("HEAD_LR = 0.004 ", "HEAD_LR = 0.006 ")
    children = [child for _, child in OfflineProposer(0).candidates(parent)]
    assert any("HEAD_LR = 0.012 " in c for c in children)  # x2 of the parent's value
    assert all("HEAD_LR = 0.008 " not in c for c in children)  # not of the baseline's


def test_offline_proposer_steps_the_value_its_profile_runs_of_a_constant_set_per_profile():
    line = next(x for x in BASELINE.split("\n") if x.startswith("MATRIX_LR = "))
    assert line.startswith("MATRIX_LR = 0.04 if GPU else 0.02 ")
    for profile, stepped, kept in (("gpu", "0.08 if GPU else 0.02", "0.04 if GPU else 0.04"),
                                   ("cpu", "0.04 if GPU else 0.04", "0.08 if GPU else 0.02")):  # fmt: skip
        proposals = dict(OfflineProposer(0).candidates(BASELINE, profile))
        changed = [c for c in proposals.values() if f"MATRIX_LR = {stepped} " in c]
        assert changed and all(f"MATRIX_LR = {kept} " not in c for c in proposals.values())
        assert f"MATRIX_LR {'0.04 -> 0.08' if profile == 'gpu' else '0.02 -> 0.04'}" in proposals


# ---------------------------------------------------------------------------------------------
# Extraction, without a server


def test_a_whole_file_in_a_python_block_is_a_proposal():
    reply = f"**Description:** narrower MLP\n```python\n{GOOD_CHILD}```"
    proposal = extract_change(reply, BASELINE)
    assert proposal.source == GOOD_CHILD and proposal.description == "narrower MLP"


def test_a_bare_diff_without_a_fence_is_a_proposal_and_prose_names_it():
    reply = f"## Narrower MLP for more steps\n\n{GOOD_DIFF}"
    proposal = extract_change(reply, BASELINE)
    assert proposal.source == GOOD_CHILD and proposal.description == "Narrower MLP for more steps"


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("I think a larger learning rate would help.", "no change"),
        ("```python\nMLP_RATIO = 3\n```", "fragment"),
        (f"```python\n{BASELINE.replace('MLP_RATIO = 4', 'MLP_RATIO = (')}```", "does not compile"),
        (f"```python\n{BASELINE}```", "unchanged"),
        (f"```diff\n{GOOD_DIFF}", "cut off"),
    ],
)
def test_replies_without_a_usable_change_are_refused_with_a_reason(reply, reason):
    with pytest.raises(ProposalRefused, match=reason):
        extract_change(reply, BASELINE)


def test_the_prompt_carries_program_train_py_and_what_peers_tried():
    history = (Attempt("GELU MLP", "discard", 0.0042, "ab" * 32, "12D3KooWpeer"),)
    system, user = build_messages(Context(BASELINE, PROGRAM, "cpu", history))
    assert system["content"] == PROGRAM
    assert BASELINE in user["content"] and "GELU MLP" in user["content"]
    assert "+0.0042" in user["content"] and "discard" in user["content"]


# ---------------------------------------------------------------------------------------------
# Through litellm, against a real OpenAI-style server on loopback


class ChatServer:
    """Answers POST /v1/chat/completions from a script: (status, reply text) per request."""

    def __init__(self, script: list[tuple]) -> None:
        self.script, self.requests = list(script), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                status, text, *delay = server.script.pop(0) if server.script else (500, "end")
                time.sleep(delay[0] if delay else 0)
                if status == 200:
                    payload = {
                        "id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()),
                        "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": text}}],
                        "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200},
                    }  # fmt: skip
                else:
                    payload = {"error": {"message": text, "type": "server_error", "code": status}}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.handle_error = lambda *args: None  # a client that timed out hung up: fine
        self.httpd.block_on_close = False  # nor wait for a handler that is still sleeping
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.api_base = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat():
    servers = []

    def start(*script: tuple) -> ChatServer:
        servers.append(ChatServer(list(script)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def llm(server: ChatServer, model: str = "openai/local-test-model", **kwargs) -> LLMProposer:
    sleeps: list[float] = []
    proposer = LLMProposer(
        model, api_base=server.api_base, api_key="sk-test", backoff_s=0.01, sleep=sleeps.append,
        **kwargs,
    )  # fmt: skip
    proposer.sleeps = sleeps
    return proposer


def test_llm_good_diff_becomes_a_proposal_that_applies(chat):
    server = chat((200, GOOD_REPLY))
    proposer = llm(server)
    proposal = proposer.propose(Context(BASELINE, PROGRAM, "test"))
    assert proposal.source == GOOD_CHILD
    assert proposal.description == "a narrower MLP, more steps"
    sent = server.requests[0]
    assert sent["messages"][0]["content"] == PROGRAM and BASELINE in sent["messages"][1]["content"]
    assert sent["model"] == "local-test-model"
    usage = proposer.usage
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (1, 1000, 200)
    assert usage.cost_usd == 0.0  # a local model litellm has no price for is free


def test_llm_broken_diff_is_refused_clearly(chat):
    broken = GOOD_DIFF.replace("MLP_RATIO = 4", "MLP_RATIO = 8")  # a removed line not in train.py
    proposer = llm(chat((200, f"Description: x\n```diff\n{broken}```")))
    with pytest.raises(ProposalRefused, match="diff is broken.*MLP_RATIO = 8"):
        proposer.propose(Context(BASELINE))
    assert proposer.usage.refused == 1


def test_llm_prose_without_a_change_is_refused_clearly(chat):
    proposer = llm(chat((200, "Try increasing the learning rate, it usually helps.")))
    with pytest.raises(ProposalRefused, match="no change"):
        proposer.propose(Context(BASELINE))


def test_llm_already_tried_change_is_refused(chat):
    proposer = llm(chat((200, GOOD_REPLY)))
    tried = frozenset({change_hash(BASELINE, GOOD_CHILD)})
    with pytest.raises(ProposalRefused, match="already tried"):
        proposer.propose(Context(BASELINE, tried=tried))


def test_llm_server_error_is_retried_then_succeeds(chat):
    server = chat((500, "overloaded"), (429, "slow down"), (200, GOOD_REPLY))
    proposer = llm(server)
    assert proposer.propose(Context(BASELINE)).source == GOOD_CHILD
    assert len(server.requests) == 3  # litellm's own retries are off: ours are counted
    assert proposer.sleeps == [0.01, 0.02] and proposer.usage.retries == 2


def test_llm_persistent_server_error_gives_up_after_bounded_attempts(chat):
    server = chat(*[(500, "down")] * 10)
    proposer = llm(server, max_attempts=3)
    with pytest.raises(ModelError, match="failed 3 times.*500"):
        proposer.propose(Context(BASELINE))
    assert len(server.requests) == 3


def test_llm_client_error_is_not_retried(chat):
    server = chat((401, "invalid api key"), (200, GOOD_REPLY))
    with pytest.raises(ModelError, match="refused the request"):
        llm(server).propose(Context(BASELINE))
    assert len(server.requests) == 1


def test_llm_spending_limit_stops_proposing_and_survives_a_restart(chat, tmp_path):
    server = chat((200, GOOD_REPLY), (200, GOOD_REPLY))
    spent = tmp_path / "spent.json"
    # A model litellm has a price for, served locally: each call costs a little.
    proposer = llm(server, model="openai/gpt-4o-mini", max_cost_usd=1e-6, spent_path=spent)
    proposer.propose(Context(BASELINE))
    assert proposer.usage.cost_usd > 1e-6
    with pytest.raises(SpendingLimitReached, match="limit"):
        proposer.propose(Context(BASELINE))
    assert len(server.requests) == 1  # the second call never reached the model
    again = llm(server, model="openai/gpt-4o-mini", max_cost_usd=1e-6, spent_path=spent)
    with pytest.raises(SpendingLimitReached):
        again.propose(Context(BASELINE))


def test_llm_spending_limit_is_the_nodes_whatever_its_workers(chat, tmp_path):
    """Two workers of one node, each with its proposer: their calls add up in one record, and
    once the node's total reaches the limit neither calls the model (before, each counted its
    own calls on top of what it read at start, and the node spent the limit once per worker)."""
    server = chat((200, GOOD_REPLY), (200, GOOD_REPLY), (200, GOOD_REPLY))
    spent = tmp_path / "llm-spend.json"
    one, two = (llm(server, model="openai/gpt-4o-mini", max_cost_usd=4e-4, spent_path=spent)
                for _ in range(2))  # fmt: skip
    one.propose(Context(BASELINE))
    cost = one.usage.cost_usd
    assert cost < 4e-4 < 2 * cost  # two calls pass the limit, one does not
    two.propose(Context(BASELINE))
    assert one.spent_usd == two.spent_usd == pytest.approx(2 * cost)
    assert json.loads(spent.read_text())["cost_usd"] == pytest.approx(2 * cost)
    for worker in (one, two):
        with pytest.raises(SpendingLimitReached, match="this node has spent"):
            worker.propose(Context(BASELINE))
    assert len(server.requests) == 2


def test_the_prompt_states_the_policy_checked_and_why_the_last_reply_was_refused(chat):
    """The rules in the prompt are made from the policy's own sets (an allowed import the
    old program.md text forbade, a torch submodule it allowed and the policy refuses), and the
    reply after a refused one is asked for with the reason."""
    _, user = build_messages(Context(BASELINE, PROGRAM, "cpu"))
    assert rules_text() in user["content"]
    assert "`functools`" in user["content"] and "`torch.utils`" not in user["content"]
    assert policy.check_source("import functools\n") == []
    assert policy.check_source("import torch.utils\n") != []
    for name in ("getattr", "load", "_foreach_"):
        assert f"`{name}`" in rules_text()
    server = chat((200, "I would make the model wider."), (200, GOOD_REPLY))
    proposer = llm(server)
    with pytest.raises(ProposalRefused) as refused:
        proposer.propose(Context(BASELINE, PROGRAM, "test"))
    proposer.propose(Context(BASELINE, PROGRAM, "test"))
    first, second = (r["messages"][-1]["content"] for r in server.requests)
    assert "was refused" not in first
    assert f"Your last reply was refused: {refused.value}" in second
    assert proposer.last_refused is None  # the reply after it was taken


def test_llm_timeout_is_retried(chat):
    server = chat((200, GOOD_REPLY, 2.0), (200, GOOD_REPLY))
    proposer = llm(server, timeout_s=0.3)
    assert proposer.propose(Context(BASELINE)).source == GOOD_CHILD
    assert len(server.requests) == 2 and proposer.usage.retries == 1


def test_a_missing_api_key_is_a_clear_error_unless_a_local_server_is_given(chat, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelError, match="needs OPENAI_API_KEY"):
        LLMProposer("openai/gpt-4o-mini")
    server = chat((200, GOOD_REPLY))
    local = LLMProposer("openai/local-model", api_base=server.api_base)  # any key will do
    assert local.propose(Context(BASELINE)).source == GOOD_CHILD


def test_the_prompt_carries_the_verified_way_to_this_train_py_and_what_was_refuted_on_it(
    tmp_path, alice, bob, carol
):
    """Each verified step from the baseline with its pooled gain, uncertainty and seeds, and the
    claims refuted on those versions, come from the ledger's judgements into the prompt."""
    from conftest import CAMPAIGN, set_terms
    from test_researcher import NARROW, NARROW_SOFTCAP, SOFTCAP, _claim, _verified_claim, sha

    from node import consensus, wire
    from node.agent.proposers import context_from_ledger
    from node.ledger import Ledger
    from node.trainer import get_profile, harness_sha256

    with Ledger(tmp_path / "l.db", campaign=CAMPAIGN) as book:
        set_terms(book, baseline=sha(BASELINE))
        _verified_claim(book, alice, bob, BASELINE, NARROW, gain=0.05)
        worse = _claim(book, carol, BASELINE, SOFTCAP, 0.02, "Logit softcap 30")
        for seed in range(consensus.HOLD_LOOKS + 3):  # its looks find it worse on every seed
            look = wire.verification_body(
                result=worse.id, child_val_bpb=1.52, parent_val_bpb=1.5, seed=200 + seed,
                profile="test", harness=harness_sha256(get_profile("test")), verdict="refute",
            )  # fmt: skip
            book.ingest(
                wire.sign(bob, "verification", CAMPAIGN, book.next_seq(bob.public_key), look).raw
            )
        states = {r["id"]: r["state"] for r in book.rows("SELECT id, state FROM claims")}
        assert states[worse.id] == "refuted", states
        context = context_from_ledger(book, NARROW_SOFTCAP, "test")
        assert context.lineage == () and context.refuted == ()  # no verified way leads there
        # A claim being judged, researched ahead of: the way goes on through its parent.
        _claim(book, carol, NARROW, NARROW_SOFTCAP, 0.01, "softer, narrow")
        ahead = context_from_ledger(book, NARROW_SOFTCAP, "test")
        assert [s.description for s in ahead.lineage] == ["a win"]  # no step of its own
        assert {a.description for a in ahead.earlier} == {
            "softer, narrow", "a win", "Logit softcap 30"
        }  # fmt: skip
        context = context_from_ledger(book, NARROW, "test")
        # a node's own looks at a peer's result ride with it: numbers it can trust as its own
        seen = {a.description: a.looked for a in context_from_ledger(
            book, NARROW, "test", me=bob.peer_id).earlier}  # fmt: skip
        assert seen["Logit softcap 30"] == pytest.approx([0.02] * (consensus.HOLD_LOOKS + 3))
        assert seen["a win"] and all(d < 0 for d in seen["a win"])  # bob verified alice's win
        theirs = context_from_ledger(book, NARROW, "test", me=carol.peer_id)
        assert all(a.looked == () for a in (*theirs.earlier, *theirs.history))
    # What was measured on the baseline, on the way here, is evidence for the proposers too.
    assert {a.description for a in context.earlier} == {"a win", "Logit softcap 30"}
    assert all(a.paired for a in context.earlier)
    judged = {a.description: a.judged for a in context.earlier}  # each claim as judged so far
    assert judged["Logit softcap 30"][0] == "refuted" and judged["Logit softcap 30"][1] < 0
    assert judged["a win"][0] == "verified" and judged["a win"][1] == pytest.approx(0.05, abs=0.01)
    assert context.history[0].judged == ("open", None, None)  # no look at it yet
    assert [a.description for a in context.history] == ["softer, narrow"]
    (step,) = context.lineage
    assert step.description == "a win" and step.by == alice.peer_id and step.seeds >= 3
    assert step.gain == pytest.approx(0.05, abs=0.01) and step.se >= 0
    (refuted,) = context.refuted
    assert refuted.description == "Logit softcap 30" and refuted.gain < 0
    _, user = build_messages(context)
    assert (
        f"- a win: {step.gain:+.4f} +- {step.se:.4f} bpb gain, {step.seeds} seeds"
        in user["content"]
    )
    assert "Logit softcap 30" in user["content"] and "refuted on the way" in user["content"]


def test_offline_proposers_of_sixteen_nodes_take_sixteen_shares_and_a_quiet_nodes_passes_on():
    """Every node ranks each change by the hash of its own id and the change's (rendezvous): it
    proposes its share first, so sixteen nodes on one head try sixteen different changes at once
    (with one seed each, they all proposed the same one first), and when a node goes quiet its
    share is the next ranked node's, with nobody assigning anything."""
    from node.agent.offline import share_of
    from node.agent.patch import change_hash
    from node.identity import Identity

    peers = [Identity(bytes([i] * 32)).peer_id for i in range(1, 17)]

    def first(me: str | None, active: list[str]) -> Proposal:
        context = Context(BASELINE, PROGRAM, "cpu", me=me, active=frozenset(active))
        return OfflineProposer(0).propose(context)

    assert len({first(None, []).source for _ in peers}) == 1  # the same seed: the same change
    assert first(peers[0], []).source == first(None, []).source  # alone, its share is everything
    proposals = {p: first(p, peers) for p in peers}
    assert len({pr.source for pr in proposals.values()}) == 16
    for peer, proposal in proposals.items():
        assert share_of(change_hash(BASELINE, proposal.source), frozenset(peers)) == peer
    quiet = peers[0]
    theirs = change_hash(BASELINE, proposals[quiet].source)
    heir = share_of(theirs, frozenset(peers[1:]))
    assert heir != quiet
    # The heir's share now holds the quiet node's first change: it comes up in the heir's order.
    context = Context(BASELINE, PROGRAM, "cpu", me=heir, active=frozenset(peers[1:]))
    order = [change_hash(BASELINE, child) for description, child
             in OfflineProposer(0)._ordered(context) if "; " not in description]  # fmt: skip
    mine = [c for c in order if share_of(c, frozenset(peers[1:])) == heir]
    assert theirs in mine and order[: len(mine)] == mine  # its share, the inherited one too, first
    seeds_order = [change_hash(BASELINE, child) for description, child
                   in OfflineProposer(0).candidates(BASELINE, "cpu") if "; " not in description]  # fmt: skip
    # Then the others' shares: first those it would inherit next (it ranks second among the
    # active), so that two nodes done with their own shares take different changes; then the rest.
    active = frozenset(peers[1:])
    runner_up = [c for c in seeds_order if c not in mine
                 and share_of(c, active - {share_of(c, active)}) == heir]  # fmt: skip
    assert runner_up and order == mine + runner_up + [
        c for c in seeds_order if c not in mine and c not in runner_up
    ]  # each part in the seed's order
    assert mine == [c for c in seeds_order if c in mine]

    def first_of_the_others(peer: str) -> str:  # its first single change of another's share
        context = Context(BASELINE, PROGRAM, "cpu", me=peer, active=active)
        singles = (change_hash(BASELINE, child) for description, child
                   in OfflineProposer(0)._ordered(context) if "; " not in description)  # fmt: skip
        return next(c for c in singles if share_of(c, active) != peer)

    others = [p for p in peers[1:] if p != heir]
    # each node's first pick after its own share: spread, where every node took one before
    assert len({first_of_the_others(p) for p in others}) > len(others) // 2


def test_offline_proposer_follows_the_evidence_of_every_peer_on_the_head_and_on_its_lineage():
    """A step down of HEAD_LR measured worse by a peer closes that way and opens the other: the
    next proposals step it up and the steps down come last; a move verified on the way here
    comes first again, a step further; a refuted one comes last."""

    def order(**evidence) -> list[str]:
        context = Context(BASELINE, PROGRAM, "test", **evidence)
        return [d for d, _ in OfflineProposer(0)._ordered(context) if "; " not in d]

    worse = Attempt(
        "HEAD_LR 0.004 -> 0.002", "discard", 0.09, "h", "12D3KooWpeer", paired=(0.08, 0.1)
    )
    plain, told = order(), order(history=(worse,))
    assert not plain[0].startswith("HEAD_LR")  # the seed's order does not start there
    assert told[0].startswith("HEAD_LR 0.004 -> ") and float(told[0].split()[-1]) > 0.004
    downs = [
        d for d in told if d.startswith("HEAD_LR 0.004 -> 0.00") and float(d.split()[-1]) < 0.004
    ]
    assert downs and told[-len(downs) :] == downs  # the way the evidence closed, last
    assert sorted(told) == sorted(plain)  # an order, nothing dropped

    from node.agent.proposers import Judged

    won = Judged("MATRIX_LR 0.028 -> 0.02", 0.03, 0.005, 4, "12D3KooWpeer")  # down won on the way
    refuted = Judged("ADAM_BETAS[0] 0.9 -> 0.8", -0.02, 0.005, 4, "12D3KooWpeer")
    led = order(lineage=(won,), refuted=(refuted,))
    assert led[0].startswith("MATRIX_LR 0.02 -> ") and float(led[0].split()[-1]) < 0.02
    assert led[-1].startswith("ADAM_BETAS[0] 0.8 -> ") and float(led[-1].split()[-1]) < 0.8
    # A move measured on an earlier version of the way counts where this parent holds none.
    before = Attempt(
        "WARMDOWN 0.4 -> 0.2", "discard", None, "h3", "12D3KooWpeer", paired=(0.03, 0.05)
    )
    late = order(earlier=(before,))
    assert late[0].startswith("WARMDOWN 0.4 -> ") and float(late[0].split()[-1]) > 0.4
    # This parent's own pairs outweigh as many of an earlier version's: the parent has moved.
    here = Attempt(
        "WARMDOWN 0.4 -> 0.28", "discard", None, "h4", "12D3KooWpeer", paired=(-0.02, -0.03)
    )
    overruled = order(earlier=(before,), history=(here,))
    assert set(overruled[:2]) == {"WARMDOWN 0.4 -> 0.2", "WARMDOWN 0.4 -> 0.28"}
    # A pair of two favoured moves comes before the pairs of moves without evidence.
    context = Context(BASELINE, PROGRAM, "test", lineage=(won,), history=(worse,))
    first_pair = next(d for d, _ in OfflineProposer(0)._ordered(context) if "; " in d)
    assert "MATRIX_LR" in first_pair and "HEAD_LR" in first_pair


def test_a_change_a_peer_discarded_on_seeds_that_favoured_it_runs_again_on_another_node():
    """A real gain of one sigma fails the margin of two more often than not: a single change a
    peer discarded on seeds that favoured it (the evidence now says it may gain more than a
    change nobody measured) is proposed again, by one node of those that did not run it, up to
    AGAIN_RUNS runs in all. Not one the evidence does not favour, nor one this node ran (its
    seeds would repeat its runs), nor a kept one, nor a running one, nor a pair."""
    from node.agent.beliefs import beliefs
    from node.agent.offline import AGAIN_RUNS, again, share_of

    edit = "Four Newton-Schulz steps in Muon instead of five"
    child = dict(OfflineProposer(0).candidates(BASELINE, "test"))[edit]
    change = change_hash(BASELINE, child)

    def run(by: str, delta: float = -0.012, outcome: str = "discard") -> Attempt:
        return Attempt(edit, outcome, delta, change, by, paired=(delta,))

    def context(*history: Attempt, **kw) -> Context:
        return Context(BASELINE, PROGRAM, "test", history=history, sigma=0.01, **kw)

    def worth(*history: Attempt) -> dict[str, int]:
        return again(context(*history), beliefs(context(*history)))

    assert OfflineProposer(0).propose(context(run("12D3KooWpeer"))).source == child
    peers = [f"12D3KooWpeer{i:02d}" for i in range(16)]
    firsts = {p: OfflineProposer(0).propose(context(run(peers[0]), me=p, active=frozenset(peers)))
              for p in peers}  # fmt: skip
    drawn = [p for p, proposal in firsts.items() if proposal.source == child]
    assert drawn == [share_of(f"{change}:1", frozenset(peers[1:]))]
    assert worth(run(peers[0]), run(peers[1])) == {change: 2}
    assert worth(*(run(p) for p in peers[:AGAIN_RUNS])) == {}
    assert worth(run(peers[0], delta=0.012)) == {}  # its pair did not favour it
    assert worth(run(peers[0]), run("this node", delta=-0.012)) == {}
    assert worth(run(peers[0], outcome="keep")) == {}  # a claim: its looks judge it
    assert worth(run(peers[0]), run(peers[1], outcome="running")) == {}
    pair = dataclasses.replace(run(peers[0]), description=f"{edit}; HEAD_LR 0.004 -> 0.002")
    assert worth(pair) == {}


def test_a_claims_looks_not_its_authors_numbers_tell_what_its_change_does():
    """A liar signs a gain of 5 sigmas for its change: once other peers' looks count on the claim,
    every node's proposer believes their pooled gain, not the signed pairs (which would put the
    fake first in every pair it proposes). A claim found misreported is nobody's win: when its
    looks favour its change, another node runs it again on its own seeds (`again`)."""
    from node.agent.beliefs import beliefs
    from node.agent.offline import again

    sigma, liar = 0.01, "12D3KooWliar"
    edit = "Four Newton-Schulz steps in Muon instead of five"
    child = dict(OfflineProposer(0).candidates(BASELINE, "test"))[edit]
    change = change_hash(BASELINE, child)

    def claim(judged) -> Context:
        lie = Attempt(edit, "keep", -0.05, change, liar, paired=(-0.05, -0.05), judged=judged)
        return Context(BASELINE, PROGRAM, "test", history=(lie,), sigma=sigma)

    unlooked = beliefs(claim(("open", None, None))).of(edit)
    assert unlooked.mean < -3 * sigma  # its author's word is all there is yet
    refuted = beliefs(claim(("refuted", -0.01, 0.005))).of(edit)  # the looks: 0.01 worse
    assert refuted.mean > 0 and refuted.gain < 0.2 * sigma
    real = claim(("misreported", 0.012, 0.005))  # a real change, its numbers made up
    known = beliefs(real)
    assert -0.013 < known.of(edit).mean < -0.005
    assert again(real, known) == {change: 1}
    proposal = OfflineProposer(0).propose(real)
    assert (proposal.source, proposal.rerun) == (child, True)
    for judged in (("verified", 0.012, 0.005), ("misreported", -0.01, 0.005)):
        assert again(claim(judged), beliefs(claim(judged))) == {}  # a win: adopted; a loss


def test_most_changes_lose_so_a_move_measured_a_little_better_runs_before_an_unmeasured_one():
    """What changes of a kind do is learned as measured, noise taken out: when most steps lost
    (a few by far) and a few gained a little, a move nobody measured is most likely a loss, and
    a move a peer measured once a little better than the parent, inside the noise, is less
    likely one of the large losses: it may gain more, and runs again before any unmeasured
    move; one measured a little worse does not."""
    from node.agent.beliefs import beliefs, evidence_key

    sigma = 0.01
    names = (
        "HEAD_LR 0.004 -> 0.002",
        "WARMDOWN 0.4 -> 0.2",
        "EMBED_LR 0.6 -> 0.3",
        "MATRIX_LR 0.02 -> 0.01",
        "ADAM_BETAS[0] 0.9 -> 0.8",
        "WEIGHT_DECAY 0.1 -> 0.05",
    )
    lost = tuple(Attempt(d, "discard", None, f"l{i}", "p", paired=(0.01 * (3 + 4 * i),))
                 for i, d in enumerate(names))  # fmt: skip
    step = "MATRIX_LR 0.02 -> 0.028"
    child = dict(OfflineProposer(0).candidates(BASELINE, "test"))[step]

    def context(delta: float) -> Context:
        ran = Attempt(step, "discard", None, change_hash(BASELINE, child), "p", paired=(delta,))
        return Context(BASELINE, PROGRAM, "test", earlier=lost, history=(ran,), sigma=sigma)

    known = beliefs(context(-0.008))
    assert known.spread[False] > 3 * sigma  # the losses' spread
    fresh = known.unmeasured("SOFTCAP 15 -> 10")
    assert fresh.mean > 0 and fresh.gain < 0.5 * sigma  # most likely a loss, a small gain at best
    assert known.of(step).gain > 2 * fresh.gain

    def first_of(delta: float) -> list[str]:  # the single changes before the first unmeasured
        order = [d for d, _ in OfflineProposer(0)._ordered(context(delta)) if "; " not in d]
        unmeasured = [i for i, d in enumerate(order) if evidence_key(d) not in known.known]
        return order[: unmeasured[0]]

    assert step in first_of(-0.008)
    assert step not in first_of(0.008)


def test_the_changes_measured_better_than_noise_are_proposed_together_first():
    """After a round of single changes, those whose pooled measurements beat no change by more
    than SURE standard errors (this node's own results and looks, on this parent or on the way
    here, and claims the swarm's rule verified) are proposed first as one change: the better
    measured step of each constant, of two edits of one line the better. Inside the noise,
    measured worse, never measured as it stands, refuted by the looks at it, or a peer's numbers
    not verified yet (any key can sign them): left out."""
    from node.agent.offline import SURE, combination

    sigma, peer = 0.002, "12D3KooWpeer"

    def tried(description: str, *paired: float, by: str = "this node") -> Attempt:
        return Attempt(description, "keep", None, f"h {description}", by, paired)

    cosine, floor = "Cosine warmdown instead of a linear one", "Learning rate falls to 10%"
    floor += " of its peak, not to zero"
    history = (
        tried("HEAD_LR 0.004 -> 0.0056", -0.008, -0.007),  # 5 sigmas of the mean of two
        tried("HEAD_LR 0.004 -> 0.008", -0.005, -0.006),  # the same constant, less: out
        tried(cosine, -0.009),  # an edit, one seed, 4.5 sigmas
        tried(floor, -0.006),  # another edit of the same line, less: out
        tried("EMBED_LR 0.3 -> 0.42", -0.001, -0.002),  # 1.1 sigmas: inside the noise
        tried("MATRIX_LR 0.02 -> 0.01", 0.01, 0.012),  # worse; its opposite, never run: out
    )
    earlier = (tried("WARMDOWN 0.4 -> 0.56", -0.006, -0.004),)  # on the way here, 3.5 sigmas
    context = Context(BASELINE, PROGRAM, "test", history=history, earlier=earlier, sigma=sigma,
                      me=peer + "me")  # fmt: skip
    proposal = OfflineProposer(0).propose(context)
    parts = [cosine, "HEAD_LR 0.004 -> 0.0056", "WARMDOWN 0.4 -> 0.56"]
    assert proposal.description == "; ".join(sorted(parts))
    singles = dict(OfflineProposer(0).candidates(BASELINE, "test"))
    for part in parts:  # each part's change is in the combination, as that change alone makes it
        (line,) = set(singles[part].split("\n")) - set(BASELINE.split("\n"))
        assert line in proposal.source.split("\n")
    changed = set(proposal.source.split("\n")) - set(BASELINE.split("\n"))
    assert len(changed) == 3 and policy.check_source(proposal.source) == []
    # one edge of SURE: the mean of two pairs just past it joins, just inside it does not
    edge = SURE * sigma / 2**0.5
    for beyond, joins in ((1.01, True), (0.99, False)):
        near = tried("EMBED_LR 0.3 -> 0.42", -edge * beyond, -edge * beyond)
        found = combination(dataclasses.replace(context, history=(*history[:4], history[5], near)))
        assert found is not None and ("EMBED_LR 0.3 -> 0.42" in found[0]) is joins
    # A claim counts by its looks once the swarm's rule verified it, whoever measured it: a
    # peer's verified claim joins, though its author's numbers are nothing; one refuted or left
    # unproven is out, whatever this node measured of it.
    theirs = tried("WARMDOWN 0.4 -> 0.56", 0.001, by=peer)
    backed = dataclasses.replace(theirs, judged=("verified", 0.005, 0.001))
    found = combination(dataclasses.replace(context, earlier=(backed,)))
    assert found is not None and "WARMDOWN 0.4 -> 0.56" in found[0]
    for judged in (("refuted", -0.001, 0.002), ("unproven", None, None)):
        found = combination(dataclasses.replace(context, earlier=(
            dataclasses.replace(earlier[0], judged=judged),)))  # fmt: skip
        assert found is not None and found[0] == f"{cosine}; HEAD_LR 0.004 -> 0.0056", judged
    # A peer's numbers are any key's to sign: its results, and the looks at its claim before the
    # rule verified it (colluders confirm each other's changes of no gain with made-up looks),
    # count for nothing, however good; this node's own id counts as this node.
    for lure in (
        tried("WARMDOWN 0.4 -> 0.56", -0.02, -0.02, by=peer),
        dataclasses.replace(theirs, judged=("open", None, None), paired=(-0.02, -0.02)),
        dataclasses.replace(theirs, judged=("open", 0.02, 0.001)),
    ):
        found = combination(dataclasses.replace(context, earlier=(lure,)))
        assert found is not None and "WARMDOWN" not in found[0], lure
    mine = tried("WARMDOWN 0.4 -> 0.56", -0.006, -0.004, by=context.me)
    found = combination(dataclasses.replace(context, earlier=(mine,)))
    assert found is not None and "WARMDOWN 0.4 -> 0.56" in found[0]
    # this node's own looks at a peer's claim (as a verifier, say) are its own numbers
    looked = dataclasses.replace(theirs, judged=("open", None, None), looked=(-0.006, -0.004))
    found = combination(dataclasses.replace(context, earlier=(looked,)))
    assert found is not None and "WARMDOWN 0.4 -> 0.56" in found[0]
    # one favoured change alone is no combination: its own single proposal is first
    alone = Context(BASELINE, PROGRAM, "test", history=history[:1], sigma=sigma)
    assert combination(alone) is None
    assert "; " not in OfflineProposer(0).propose(alone).description


def test_a_difference_inside_the_nodes_noise_is_no_lead():
    """The order weighs the evidence by the node's noise: a move measured a little better than
    its parent, well inside one paired sigma, waits behind the moves nobody measured (it has
    less room to surprise); the same difference on a quiet machine, several sigmas, leads, and
    on a noisy one, half a sigma, it may gain hardly more than a move nobody measured."""
    from node.agent.beliefs import beliefs

    def context(delta: float, sigma: float) -> Context:
        step = Attempt(
            "HEAD_LR 0.004 -> 0.0056", "discard", None, "h", "12D3KooWpeer", paired=(delta,)
        )
        return Context(BASELINE, PROGRAM, "test", history=(step,), sigma=sigma)

    def order(delta: float, sigma: float) -> list[str]:
        return [d for d, _ in OfflineProposer(0)._ordered(context(delta, sigma)) if "; " not in d]

    def lead(delta: float, sigma: float) -> float:  # its gain over an unmeasured move's
        known = beliefs(context(delta, sigma))
        return (
            known.of("HEAD_LR 0.004 -> 0.008").gain / known.unmeasured("WARMDOWN 0.4 -> 0.2").gain
        )

    plain = [
        d
        for d, _ in OfflineProposer(0)._ordered(Context(BASELINE, PROGRAM, "test"))
        if "; " not in d
    ]
    up = [d for d in plain if d.startswith("HEAD_LR 0.004 -> ") and float(d.split()[-1]) > 0.004]
    assert len(up) == 2 and not plain[0].startswith("HEAD_LR")
    assert order(-0.01, 0.002)[0] in up  # 5 sigmas better: the next step up comes first
    assert min(order(-0.0002, 0.011).index(d) for d in up) > 10  # inside the noise: no lead
    assert lead(-0.01, 0.002) > 3 and lead(-0.01, 0.02) < 1.1  # on a noisy machine, hardly any


def test_the_spread_of_a_kind_of_change_is_learned_from_what_the_swarm_measured():
    """Before any evidence about a move, it is expected to do what changes of its kind did: when
    the steps of the profile's model size measured far more than the noise and the constants'
    steps did not, the untried model-size steps come first on the next head."""
    sigma, row = 0.01, "on the test profile"
    earlier = [
        Attempt(f"DEVICE_BATCH 16 -> 8 {row}", "discard", None, "r1", "p", paired=(-0.05,)),
        Attempt(f"MODEL_DIM 64 -> 96 {row}", "discard", None, "r2", "p", paired=(-0.03,)),
        Attempt(f"DEPTH 2 -> 3 {row}", "discard", None, "r3", "p", paired=(0.04,)),
    ] + [
        Attempt(d, "discard", None, f"c{i}", "p", paired=(0.002 * (-1) ** i,))
        for i, d in enumerate(("HEAD_LR 0.004 -> 0.002", "WARMDOWN 0.4 -> 0.2",
                               "EMBED_LR 0.6 -> 0.3", "MATRIX_LR 0.02 -> 0.01"))
    ]  # fmt: skip
    context = Context(BASELINE, PROGRAM, "test", earlier=tuple(earlier), sigma=sigma)
    from node.agent.beliefs import beliefs

    # the spreads of the test profile's model-size row (DEPTH, MODEL_DIM, ...) and of the rest
    known = beliefs(context)
    assert known.spread[True] > 2 * sigma > known.spread[False]
    order = [d for d, _ in OfflineProposer(0)._ordered(context) if "; " not in d]
    untried_rows = [d for d in order if d.endswith(row) and not d.startswith(("DEVICE_BATCH",
                    "MODEL_DIM", "DEPTH"))]  # fmt: skip
    assert untried_rows and order.index(untried_rows[0]) < 6


def test_an_edit_measured_on_the_way_here_is_ordered_by_what_it_did_there():
    """An edit is no move of a constant: the evidence about it is its own. One that lost on an
    earlier version of the lineage is tried last on the new head, not again in the seed's turn;
    one that gained there (but not past its margin) is tried first."""

    def order(*earlier: Attempt) -> list[str]:
        context = Context(BASELINE, PROGRAM, "test", earlier=earlier)
        return [d for d, _ in OfflineProposer(0)._ordered(context) if "; " not in d]

    cosine, floor = (
        "Cosine warmdown instead of a linear one",
        "Learning rate falls to 10% of its peak, not to zero",
    )
    lost = Attempt(cosine, "discard", None, "h1", "12D3KooWpeer", paired=(0.025, 0.033))
    gained = Attempt(floor, "discard", None, "h2", "12D3KooWpeer", paired=(-0.010, -0.011))
    plain, told = order(), order(lost, gained)
    assert plain.index(cosine) < len(plain) - 1 and plain.index(floor) > 0  # the seed's order
    assert told[-1] == cosine and told[0] == floor
    assert sorted(told) == sorted(plain)  # an order, nothing dropped
    from node.agent.beliefs import beliefs

    believed = beliefs(Context(BASELINE, PROGRAM, "test", earlier=(lost,))).known
    assert list(believed) == [(cosine, 0)]  # no opposite of an edit is made up
    assert 0 < believed[(cosine, 0)].mean < 0.029  # the pairs' mean, shrunk toward no effect


def test_the_prompt_lists_the_latest_experiments_and_the_offline_proposer_reads_them_all():
    from node.agent.llm import MAX_HISTORY_SHOWN

    tried = tuple(
        Attempt(f"WARMDOWN step {i}", "discard", 0.01, f"h{i}", "12D3KooWpeer") for i in range(40)
    )
    _, user = build_messages(Context(BASELINE, PROGRAM, "test", history=tried))
    shown = [i for i in range(40) if f"] WARMDOWN step {i}\n" in user["content"] + "\n"]
    assert shown == list(range(MAX_HISTORY_SHOWN))
    # the 40th experiment, beyond what a prompt shows, still moves the offline proposer's order
    last = Attempt("HEAD_LR 0.004 -> 0.002", "discard", 0.09, "h", "12D3KooWpeer", paired=(0.09,))
    context = Context(BASELINE, PROGRAM, "test", history=(*tried, last))
    first = OfflineProposer(0).propose(context).description
    assert first.startswith("HEAD_LR 0.004 -> ") and float(first.split()[-1]) > 0.004


@pytest.mark.parametrize(
    "description",
    ["x - -> e", "NAME e -> 1", "LR . -> 2", "A 1 -> 1", "a pair 1 -> 2; B 2 -> 3 x", "", "->"],
)
def test_a_peers_description_of_any_form_moves_nothing_and_breaks_nothing(description):
    from node.agent.beliefs import move

    odd = Attempt(description, "discard", 0.5, "h", "12D3KooWpeer", paired=(0.5,))
    assert move(description) is None
    OfflineProposer(0).propose(Context(BASELINE, PROGRAM, "test", history=(odd,), earlier=(odd,)))


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("value", [-1e6, -3.0, 5e4, 1e-12])
def test_a_peers_numbers_however_far_out_order_everything_and_break_nothing(value):
    """Any key can sign any paired differences: numbers far past what a run can measure, on
    single changes and pairs alike, leave every belief finite, and the proposer proposes."""
    import math

    from node.agent.beliefs import beliefs

    odd = tuple(
        Attempt(d, "discard", value, f"h{i}", "12D3KooWpeer", paired=(value, value))
        for i, d in enumerate(("HEAD_LR 0.004 -> 0.002", "WARMDOWN 0.4 -> 0.2",
                               "HEAD_LR 0.004 -> 0.002; WARMDOWN 0.4 -> 0.2"))
    )  # fmt: skip
    context = Context(BASELINE, PROGRAM, "test", history=odd, earlier=odd, sigma=0.002)
    known = beliefs(context)
    pair = known.of("HEAD_LR 0.004 -> 0.0056; WARMDOWN 0.4 -> 0.56")
    assert all(math.isfinite(x) for b in (*known.known.values(), pair)
               for x in (b.mean, b.sd, b.gain))  # fmt: skip
    assert OfflineProposer(0).propose(context).description
