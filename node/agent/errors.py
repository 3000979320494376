"""The agent's exceptions: patches that do not apply, proposals refused, models that fail.

Every message says what went wrong and what to do about it; none of them is a bug report.
"""

from node.errors import SwarmError


class AgentError(SwarmError):
    """Something in the research agent a user can act on: a patch, a proposal, a model call."""


class PatchError(AgentError):
    """A diff that does not apply, is too large, or makes a train.py that does not compile."""


class ProposalRefused(AgentError):
    """A proposer's reply held no usable change (prose only, a broken diff, a broken file)."""


class ModelError(AgentError):
    """The language model could not be reached or answered with an error, after the retries."""


class SpendingLimitReached(AgentError):
    """This node has spent its budget for model calls; raise the limit or use the offline proposer."""
