"""The bootstrap: a long-lived peer with a stable key that newcomers dial first, and what
deploying one takes. It trains nothing; any node can play this part.

    service.py                 the service: serve a campaign's file and facts, relay, sync
    cli.py                     `swarm bootstrap`, registered on the node's command line through
                               the package's entry point (the node never imports this package)
    README.md                  running a public bootstrap: ports, key, address, upgrades
    swarm-bootstrap.service    a systemd unit
    Containerfile              a container recipe
"""
