"""The research agent: proposers, patches of train.py, and the research step.

It decides what to try and publishes what it ran; it never decides what the swarm believes
(that is `node.consensus`) and never talks to the network (that is `node.gossip`).
"""

from node.agent.errors import (
    AgentError,
    ModelError,
    PatchError,
    ProposalRefused,
    SpendingLimitReached,
)
from node.agent.llm import LLMProposer
from node.agent.offline import FixedList, OfflineProposer
from node.agent.patch import apply_diff, change_hash, diff_hash, make_diff, merge, normalise_diff
from node.agent.proposers import Attempt, Context, Proposal, Proposer, context_from_ledger

__all__ = [
    "AgentError",
    "Attempt",
    "Context",
    "FixedList",
    "LLMProposer",
    "ModelError",
    "OfflineProposer",
    "PatchError",
    "Proposal",
    "ProposalRefused",
    "Proposer",
    "SpendingLimitReached",
    "apply_diff",
    "change_hash",
    "context_from_ledger",
    "diff_hash",
    "make_diff",
    "merge",
    "normalise_diff",
]
