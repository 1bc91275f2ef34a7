"""What importing the gateway's request path (gateway/proxy.py) loads, in a fresh interpreter.

A gateway process is started, and each of its requests handled, with that closure in memory:
it must not carry the control plane. No engine installer or source build, no placement, no
catalog, no workflow definition (a client's typed view such as workflows/model/api.py is
fine), nothing of activities/ or workers/; and the whole stays within a stated number of
llmgw's own modules, so that growth is a decision someone makes here, not a drift."""

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN = ("gateway", "kv", "engines", "workflows", "activities", "workers", "store", "bench")
# 108 when this bound was first set at 115; 116 once the request log and its series
# (gateway/observe/: four modules, issue 34) joined the path, which records every request; 121
# once issue 35 gave the path its own parts (the upstream HTTP client, plain metrics, the body
# splice, the response cycle split out of http_limits.py). Room for a few modules more, not for
# a package.
MOST_MODULES = 125
NEVER = (
    "activities",
    "workers",
    "bench",
    "engines.install_",
    "engines.build_",
    "engines.release_",
    "engines.verify",
    "workflows.placement",
    "workflows.catalog",
)


def loaded_by(module: str) -> list[str]:
    probe = (
        f"import sys, json; before = set(sys.modules); import {module}; "
        f"print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [m for m in json.loads(out) if m.split(".")[0] in OWN]


def defines_a_workflow(module: str) -> bool:
    """A module with a @workflow.defn class other than a client's view (*Api)."""
    path = ROOT / Path(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ClassDef) and not node.name.endswith("Api"):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ast.unparse(target) == "workflow.defn":
                    return True
    return False


def test_the_request_path_loads_no_control_plane() -> None:
    loaded = loaded_by("gateway.proxy")
    assert "gateway.proxy" in loaded
    assert not [m for m in loaded if m.startswith(NEVER)]
    assert not [m for m in loaded if defines_a_workflow(m)]
    assert len(loaded) <= MOST_MODULES, f"{len(loaded)} of llmgw's modules: {loaded}"


def test_the_check_finds_a_workflow_where_there_is_one() -> None:
    """The AST check above is not blind: it finds the model workflow and passes its client view."""
    assert defines_a_workflow("workflows.model.workflow")
    assert not defines_a_workflow("workflows.model.api")
    assert [m for m in loaded_by("workflows.model.workflow") if m.startswith(NEVER)]
