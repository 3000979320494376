"""The swarm at scale, in simulation: the real signed facts, ledger and adoption rule, with an
in-memory transport on a virtual clock and a surrogate trainer whose landscape and noise are known.

`Simulation(Settings(...)).run()` returns the figures (docs/simulation.md). It never opens a
socket, never runs train.py and never waits on the wall clock.
"""

from node.simulation.swarm import LEDGER_MAX_NODES, TARGET, Settings, Simulation

__all__ = ["LEDGER_MAX_NODES", "TARGET", "Settings", "Simulation"]
