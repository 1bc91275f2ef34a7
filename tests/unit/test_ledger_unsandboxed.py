"""The ledger runs outside Temporal's workflow sandbox (`sandboxed=False`, workflows/ledger.py),
so what the sandbox would refuse at run time is refused here, in its code: every module it
imports, from workflows/ on down, may import only deterministic standard modules, may not read
a clock, randomness or the process's hash seed in its functions, and keeps no mutable state at
module level (a sandboxed workflow gets fresh modules each run; this one shares them)."""

import ast
from functools import cache
from pathlib import Path

from temporalio import workflow

from tests.source_reading import parse_file
from workers.registry import CONTROL_WORKFLOWS
from workflows.ledger import ClusterLedgerWorkflow

ROOT = Path(__file__).parents[2]
# What a module in the ledger's closure may import from outside workflows/.
ALLOWED = {
    "__future__",
    "base64",
    "bisect",
    "collections.abc",
    "dataclasses",
    "datetime",  # for types and timedelta constants; clock calls are refused below
    "enum",
    "hashlib",
    "heapq",
    "json",
    "pydantic",
    "re",
    "temporalio",
    "temporalio.common",
    "temporalio.exceptions",
    "types",
    "typing",
    "zlib",
}
# Settings read once, at import, from the environment (test knobs and timeouts).
READS_ENVIRONMENT_AT_IMPORT = {"workflows.options", "workflows.history_budget"}
CLOCK_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "Counter", "OrderedDict", "deque"}


def module_path(name: str) -> Path | None:
    for path in (
        ROOT / f"{name.replace('.', '/')}.py",
        ROOT / name.replace(".", "/") / "__init__.py",
    ):
        if path.exists():
            return path
    return None


@cache
def ledger_closure() -> dict[str, ast.Module]:
    """Every workflows/ module the ledger imports, directly or not, parsed."""
    parsed: dict[str, ast.Module] = {}
    todo = ["workflows.ledger"]
    while todo:
        name = todo.pop()
        path = module_path(name)
        if name in parsed or path is None:
            continue
        parsed[name] = tree = parse_file(path)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("workflows")
            ):
                todo.append(node.module)
                todo.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return parsed


def outside_imports(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and not node.module.startswith("workflows")
        ):
            found.add(node.module)
    return found


def test_the_ledger_is_the_one_workflow_outside_the_sandbox():
    outside = [
        cls for cls in CONTROL_WORKFLOWS if not workflow._Definition.must_from_class(cls).sandboxed
    ]
    assert outside == [ClusterLedgerWorkflow]


def test_the_ledger_imports_only_deterministic_modules():
    closure = ledger_closure()
    assert {"workflows.placement.place", "workflows.ledger_compact"} <= set(closure)
    for name, tree in closure.items():
        extra = outside_imports(tree) - ALLOWED
        if name in READS_ENVIRONMENT_AT_IMPORT:
            extra -= {"os"}
        assert not extra, f"{name} imports {sorted(extra)}, which the ledger must not run"


def test_the_ledger_reads_no_clock_randomness_or_hash_seed_in_its_functions():
    for name, tree in ledger_closure().items():
        for func in (
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ):
            for node in ast.walk(func):
                if not isinstance(node, ast.Call):
                    continue
                called = node.func
                if isinstance(called, ast.Name):
                    assert called.id != "hash", f"{name}.{func.name} calls hash(): per process"
                if isinstance(called, ast.Attribute) and called.attr in CLOCK_CALLS:
                    owner = called.value
                    clock = f"{name}.{func.name} reads a clock ({ast.unparse(called)})"
                    assert isinstance(owner, ast.Name), clock
                    assert owner.id == "workflow", f"{clock}: use workflow.now()"
                if isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name):
                    assert called.value.id != "os", (
                        f"{name}.{func.name} calls {ast.unparse(called)}"
                    )


def test_the_ledger_keeps_no_mutable_state_at_module_level():
    for name, tree in ledger_closure().items():
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                value = node.value
                mutable = isinstance(value, ast.Dict | ast.List | ast.Set) or (
                    isinstance(value, ast.Call)
                    and isinstance(value.func, ast.Name)
                    and value.func.id in MUTABLE_CALLS
                )
                target = ast.unparse(
                    node.targets[0] if isinstance(node, ast.Assign) else node.target
                )
                assert not mutable or target == "__all__", (
                    f"{name}: module-level {target} is mutable, and shared by every ledger run "
                    "in the process (use a tuple, frozenset or MappingProxyType)"
                )
        assert not any(isinstance(n, ast.Global) for n in ast.walk(tree)), f"{name} uses global"
