"""What a research worker is doing, for the person running its node: the status file that
`swarm status` reads, rewritten at each change, and a line for `swarm join`'s output each time
the work changes (a run begun, an outcome)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

# A run's events that start a phase, and the phase.
RUN_PHASES = {"started": "starting", "train_start": "training", "eval_start": "scoring"}


class Doing:
    """`path`: the status file (None: none); `say`: the line's reader (None: nobody);
    `status`: the whole status to write, this object's fields among them (`fields`)."""

    def __init__(
        self, path: Path | None, say: Callable[[str], None] | None, status: Callable[[], dict]
    ) -> None:
        self.path, self.say, self.status = path, say, status
        self.doing = "starting"
        self.change: str | None = None  # the one-line description of the change in hand
        self.phase: str | None = None  # of the run in flight: starting, training or scoring
        self.progress: float | None = None

    def fields(self) -> dict:
        return {"doing": self.doing, "change": self.change, "phase": self.phase,
                "progress": self.progress}  # fmt: skip

    def set(self, doing: str, change: str | None = None) -> None:
        if self.say is not None and (doing, change) != (self.doing, self.change):
            self.say(doing + (f": {change}" if change and change not in doing else ""))
        self.doing, self.change, self.phase, self.progress = doing, change, None, None
        self.write()

    def event(self, event: dict) -> None:
        """A run's events: its phase and progress, and the change a research step tries."""
        kind = event.get("event")
        if kind == "trying":  # loop.research_step: the proposal, before its run
            self.doing = f"research, seed {event.get('seed')} of 2"
            self.change = str(event.get("description") or "")
            if self.say is not None:
                self.say(f"{self.doing}: {self.change}")
        elif kind in RUN_PHASES:
            self.phase, self.progress = RUN_PHASES[kind], None
        elif kind == "progress" and isinstance(event.get("progress"), (int, float)):
            self.phase, self.progress = "training", float(event["progress"])
        else:
            return
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.status()))
        tmp.replace(self.path)
