"""research-swarm: a peer-to-peer swarm of research agents that improve a training script.

The package is split into rooms that talk one way: `cli` -> `node` -> (`gossip`, `agent`,
`trainer`, `ledger`). `wire` and `identity` are leaves that anyone may import.
"""

__version__ = "0.1.0"
