"""The root of every error a user can act on.

Each subsystem raises its own subclass (`TrainerError`, `WireError`, `LedgerError`, ...) with a
message that says what was wrong and what to do; the CLI prints it on one line and exits 1.
"""


class SwarmError(Exception):
    """An error with a message meant for the user, not a traceback."""
