"""Campaign files: what a group agrees on before it researches together, signed by its organiser.

A campaign file holds the signed `campaign` fact (name, organiser, quorum, profiles, the hashes of
program.md, of the baseline train.py and of each profile's data and tokenizer) together with the
program and the baseline themselves, so one file is all a newcomer needs. Loading checks the
signature and every hash; nothing here runs a train.py or touches the network.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node import wire
from node.errors import SwarmError
from node.identity import Identity, IdentityError, peer_id_from_public_key, public_key_from_peer_id

FORMAT = "research-swarm campaign/1"
MAX_FILE = 512 * 1024  # bytes: program.md and train.py are a few KB each
MAX_DATA_READS = 4  # reads of the training split a budget may make before a node warns of it


class CampaignError(SwarmError):
    """A campaign file that cannot be used: the message says what is wrong with it."""


@dataclass(frozen=True)
class Campaign:
    fact: wire.Fact  # the organiser's signed `campaign` fact
    program: str  # program.md, the research strategy the agents read
    baseline: str  # the baseline train.py every lineage starts from

    @property
    def name(self) -> str:
        return self.fact.body["name"]

    @property
    def quorum(self) -> int:
        return self.fact.body["quorum"]

    @property
    def profiles(self) -> list[str]:
        return list(self.fact.body["profiles"])

    @property
    def organiser(self) -> str:
        return peer_id_from_public_key(self.fact.body["organiser"])

    @property
    def baseline_sha256(self) -> str:
        return self.fact.body["baseline"]

    @property
    def members(self) -> list[str] | None:
        """The members' peer ids, sorted; None for an open campaign (any key counts)."""
        keys = self.fact.body.get("members")
        return None if keys is None else sorted(peer_id_from_public_key(k) for k in keys)

    @property
    def terms(self) -> dict:
        """What a ledger of this campaign judges by (`Ledger.set_terms`)."""
        return {"name": self.name, "organiser": self.organiser, "baseline": self.baseline_sha256,
                "quorum": self.quorum, "members": self.members, "fact": self.fact.id}  # fmt: skip

    def data_for(self, profile: str) -> dict[str, str]:
        """What the campaign pinned for `profile`: data spec, tokens and tokenizer hashes."""
        prefix = profile + "."
        return {
            k[len(prefix) :]: v for k, v in self.fact.body["data"].items() if k.startswith(prefix)
        }

    def to_bytes(self) -> bytes:
        """The file: JSON a person can read, with the signed fact as the authority."""
        doc = {
            "format": FORMAT, "name": self.name, "organiser": self.organiser,
            "quorum": self.quorum, "profiles": self.profiles, "data": self.fact.body["data"],
            **({} if self.members is None else {"members": self.members}),
            "fact": base64.b64encode(self.fact.raw).decode(),
            "program": self.program, "baseline": self.baseline,
        }  # fmt: skip
        return (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode()

    @property
    def sha256(self) -> str:
        """The campaign's address: the hash of its file, e.g. to fetch it from a bootstrap."""
        return hashlib.sha256(self.to_bytes()).hexdigest()


def data_pins(profile: str, data_spec: str, manifest: dict, budget: int) -> dict[str, str]:
    """The entries a campaign records for one profile, from its prepared data's manifest, and
    the training budget (tokens) every member's runs use: results under another never compare."""
    return {
        f"{profile}.data": data_spec,
        f"{profile}.tokens": manifest["sha256"],
        f"{profile}.tokenizer": manifest["tokenizer_sha256"],
        f"{profile}.budget": str(int(budget)),
    }


def pinned_budget(campaign: Campaign | None, profile: str) -> int | None:
    """The training budget in tokens the campaign pins for `profile`; None: the profile's own
    (a campaign file written before budgets were pinned)."""
    if campaign is None:
        return None
    value = campaign.data_for(profile).get("budget")
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise CampaignError(
            f"campaign {campaign.name} pins the budget {value!r} for {profile}: expected a "
            "positive number of tokens; ask the organiser for a corrected campaign file"
        )
    return int(value)


def budget_warning(profile: str, budget_tokens: int, manifest: dict, smaller: str) -> str | None:
    """One line when a run's budget reads the profile's training split more than MAX_DATA_READS
    times, where val_bpb measures memorising more than learning (docs/trainer.md); None when it
    does not. `smaller` says where this line is read how to set a budget: `{budget}` in it
    stands for one that reads the split MAX_DATA_READS times."""
    train = manifest.get("train_tokens")
    if not train or budget_tokens <= MAX_DATA_READS * train:
        return None
    fitting = MAX_DATA_READS * train
    return (
        f"{profile}: a budget of {budget_tokens:,} tokens reads the {train:,} training tokens of "
        f"{manifest.get('data', 'its data')} {budget_tokens / train:.1f} times, so val_bpb will measure "
        f"memorising more than learning: give it more data (--data web:fineweb-edu, or urls:FILE) or "
        f"a smaller budget ({smaller.format(budget=fitting)})"
    )


def make_campaign(fact: wire.Fact, program: str, baseline: str) -> Campaign:
    """A campaign from its signed fact; raises CampaignError if the texts do not match it."""
    campaign = Campaign(fact, program, baseline)
    _check(campaign)
    return campaign


def invite(ledger: Any, me: Identity, campaign: Campaign, peer: str) -> wire.Fact:
    """Sign, as the organiser `me`, an invitation of `peer` into `campaign` (a campaign with
    members), store it in `ledger` (the organiser's, of that campaign) and return it: the node
    gossips it, and from its time the peer is a member on every node (`Rules.members_for`)."""
    if campaign.members is None:
        raise CampaignError(
            f"campaign {campaign.name} is open: any key counts already, so there is nobody to invite"
        )
    if me.peer_id != campaign.organiser:
        raise CampaignError(
            f"only campaign {campaign.name}'s organiser ({campaign.organiser}) invites; this "
            f"home's key is {me.peer_id}: run it in the organiser's home (--home)"
        )
    try:
        key = public_key_from_peer_id(peer)
    except IdentityError:
        raise CampaignError(
            f"{peer!r} is not a peer id: ask the member for the id `swarm keys show` prints"
        ) from None
    if peer in campaign.members:
        raise CampaignError(f"{peer} is a member already: the campaign file lists it")
    terms = ledger.terms()
    if terms is None:  # a home that made the campaign but never joined it: judge by its file
        ledger.set_terms(campaign.terms)
    elif terms.get("fact") != campaign.fact.id:
        raise CampaignError(
            f"this home's ledger follows another campaign file for {campaign.name}: run it in the "
            "home that joined this one"
        )
    return ledger.publish(me, "invitation", {"member": key})


def campaign_body(
    me: Identity, name: str, program: str, baseline: str, profiles: list[str], quorum: int,
    data: dict[str, str], members: list[str] | None = None,
) -> dict:  # fmt: skip
    """The body of the `campaign` fact the organiser signs; `members` the member peer ids (the
    organiser among them), None for an open campaign."""
    if quorum < 1:
        raise CampaignError("--quorum must be at least 1: a claim cannot verify itself")
    keys = None
    if members is not None:
        keys = []
        for peer in {*members, me.peer_id}:
            try:
                keys.append(public_key_from_peer_id(peer))
            except IdentityError:
                raise CampaignError(
                    f"member {peer!r} is not a peer id: ask each member for the id "
                    "`swarm keys show` prints"
                ) from None
        if len(keys) > wire.MAX_MEMBERS:
            raise CampaignError(
                f"{len(keys)} members, over {wire.MAX_MEMBERS}: split the group into campaigns"
            )
        if len(keys) <= quorum:
            raise CampaignError(
                f"{len(keys)} members cannot reach quorum {quorum}: a claim needs {quorum} "
                "members other than its author"
            )
    try:
        return wire.campaign_body(
            name=name, organiser=me.public_key, program=program.encode(),
            baseline=hashlib.sha256(baseline.encode()).hexdigest(), profiles=profiles,
            quorum=quorum, data=data, members=keys,
        )  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise CampaignError(f"cannot make campaign {name!r}: {exc}") from None


def parse_campaign(raw: bytes, where: str = "campaign file") -> Campaign:
    """A campaign from a file's bytes, its signature and hashes checked."""
    if len(raw) > MAX_FILE:
        raise CampaignError(f"{where} is {len(raw)} bytes, over {MAX_FILE}: not a campaign file")
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"its format is not {FORMAT!r}")
        fact_raw = base64.b64decode(doc["fact"], validate=True)
        program, baseline = doc["program"], doc["baseline"]
        if not isinstance(program, str) or not isinstance(baseline, str):
            raise ValueError("program and baseline must be text")
    except (ValueError, KeyError, TypeError) as exc:
        raise CampaignError(
            f"{where} is not a campaign file ({exc}): make one with `swarm campaign new`"
        ) from None
    fact = wire.decode(fact_raw)
    if isinstance(fact, wire.Rejection):
        raise CampaignError(
            f"{where}: its signed fact was refused ({fact.reason.value}: {fact.detail})"
        )
    if fact.kind != "campaign":
        raise CampaignError(f"{where}: its signed fact is a {fact.kind}, not a campaign")
    campaign = Campaign(fact, program, baseline)
    _check(campaign, where)
    signed = json.loads(campaign.to_bytes())
    edited = [
        key
        for key in ("name", "organiser", "quorum", "profiles", "data", "members")
        if doc.get(key) != signed.get(key)
    ]
    if edited:
        raise CampaignError(
            f"{where}: its fields {', '.join(edited)} differ from what the organiser signed: "
            "get the file again from the organiser"
        )
    return campaign


def load_campaign(path: Path | str) -> Campaign:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CampaignError(f"cannot read campaign file {path}: {exc.strerror}") from None
    return parse_campaign(raw, str(path))


def _check(campaign: Campaign, where: str = "campaign") -> None:
    body = campaign.fact.body
    if campaign.fact.author != body["organiser"]:
        raise CampaignError(f"{where}: signed by {campaign.fact.peer_id}, not by its organiser")
    if campaign.fact.campaign != body["name"]:
        raise CampaignError(
            f"{where}: published in campaign {campaign.fact.campaign!r}, not {body['name']!r}"
        )
    if hashlib.sha256(campaign.program.encode()).hexdigest() != body["program_sha256"]:
        raise CampaignError(f"{where}: its program.md does not match the hash the organiser signed")
    if hashlib.sha256(campaign.baseline.encode()).hexdigest() != body["baseline"]:
        raise CampaignError(
            f"{where}: its baseline train.py does not match the hash the organiser signed"
        )


def check_data(campaign: Campaign, profile: str, manifest: dict) -> None:
    """Raise CampaignError unless this node's prepared data is the data the campaign pinned."""
    pins = campaign.data_for(profile)
    for key, field in (("tokens", "sha256"), ("tokenizer", "tokenizer_sha256")):
        if key in pins and pins[key] != manifest.get(field):
            raise CampaignError(
                f"this node's {profile} {key} ({str(manifest.get(field))[:12]}) differ from campaign "
                f"{campaign.name}'s ({pins[key][:12]}): rebuild with `swarm data build --profile {profile} "
                f"--data {pins.get('data', '...')}` from the same sources, or ask the organiser which data they used"
            )
