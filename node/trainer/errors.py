"""The trainer's one exception type: data, tokenizer, runner and profile errors a user can act on."""

from node.errors import SwarmError


class TrainerError(SwarmError):
    """Something in data, tokenizer, profile or runner that the user can fix; the message says how."""
