"""The swarm at scale, in simulation: real Researchers, signed facts, ledgers and adoption rule,
with an in-memory transport on a virtual clock and a surrogate trainer whose landscape and noise
are known: ideas on or off (`landscape.py`), or the real catalogue of changes of the real
train.py, proposed by the product's offline proposer (`catalogue.py`).

`Simulation(Settings(...)).run()` returns the figures (docs/simulation.md); `study` compares
swarms and lone nodes over many seeds. It never opens a socket, never runs train.py and never
waits on the wall clock.
"""

from node.simulation.swarm import Settings, Simulation

__all__ = ["Settings", "Simulation"]
