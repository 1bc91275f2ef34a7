"""Imports go one way between llmgw's packages (docs/architecture.md, "Where the code lives"):
the ground floor (workflows/, kv/) imports nothing else of ours, and nothing imports bench/.
Read from the source, every import statement, including those inside functions."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GROUND = frozenset[str]()
MAY_IMPORT: dict[str, frozenset[str]] = {
    "workflows": GROUND,
    "kv": GROUND,
    "engines": frozenset({"workflows"}),
    "store": frozenset({"workflows"}),
    "activities": frozenset({"workflows", "kv", "engines", "store"}),
    "gateway": frozenset({"workflows", "kv", "engines", "store"}),
    "workers": frozenset({"workflows", "kv", "engines", "store", "activities", "gateway"}),
    "bench": frozenset({"workflows", "kv", "engines", "store", "activities", "gateway", "workers"}),
}


def imported_packages(source: str) -> set[str]:
    """The top-level packages `source` imports by absolute import."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_every_package_of_llmgw_has_its_rule() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} - {"tests"}
    assert packages == set(MAY_IMPORT)


def test_imports_go_one_way() -> None:
    wrong = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            ours = imported_packages(path.read_text()) & set(MAY_IMPORT) - {package}
            wrong += [f"{path.relative_to(ROOT)} imports {other}" for other in ours - allowed]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_import_inside_a_function() -> None:
    source = "def late():\n    from gateway.proxy import x\n    import workers.cli\n"
    assert imported_packages(source) == {"gateway", "workers"}
