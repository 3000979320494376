"""`python -m node.cli`: the `swarm` command."""

from node.cli import main

main()
