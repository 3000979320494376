"""The house's size: a module over about 500 lines is usually two. A module past that today may
not grow until it is split, and no other may pass it; each failure names the module."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 500  # lines a module
CEILINGS = {  # past the budget already: each one's size when its ceiling was set
    "node/local.py": 525,
    "node/trainer/runner.py": 535,
    "node/agent/researcher.py": 738,
}


def sizes() -> dict[str, int]:
    return {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for folder in ("node", "bootstrap", "scripts")
        for path in (ROOT / folder).rglob("*.py")
    }


def test_no_module_grows_past_its_budget():
    over = [
        f"{name}: {lines} lines, over {CEILINGS.get(name, BUDGET)} (split it by job)"
        for name, lines in sorted(sizes().items())
        if lines > CEILINGS.get(name, BUDGET)
    ]
    assert not over, "\n".join(over)


def test_a_ceiling_goes_once_its_module_is_back_within_the_budget():
    found = sizes()
    stale = [name for name in CEILINGS if found.get(name, 0) <= BUDGET]
    assert not stale, f"within {BUDGET} lines now, or gone: take out of CEILINGS {stale}"


def _imports(folder: Path) -> list[tuple[str, str]]:
    """(module file, absolute module it imports) for every import under `folder`."""
    import ast

    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )  # fmt: skip
            found += [(str(path.relative_to(ROOT)), name) for name in names]
    return found


def test_the_node_never_imports_the_bootstrap():
    """The bootstrap is built on the node (its command comes in through an entry point): an
    import the other way would make the two one tangle."""
    found = [f"{path}: {name}" for path, name in _imports(ROOT / "node")
             if name.split(".")[0] == "bootstrap"]  # fmt: skip
    assert not found, found


def test_gossip_is_a_transport_that_knows_no_ledger_and_no_policy():
    """Facts flow from the socket through `Facts` into the node: the network package never opens
    the ledger, judges a peer or reaches back into the node that wires it (node/network.py)."""
    closed = ("node.ledger", "node.standing", "node.evidence", "node.consensus", "node.network",
              "node.node", "node.agent")  # fmt: skip
    found = [f"{path}: {name}" for path, name in _imports(ROOT / "node" / "gossip")
             if name.startswith(closed)]  # fmt: skip
    assert not found, found
