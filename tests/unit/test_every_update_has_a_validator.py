"""Every update handler in workflows/ has a validator: an update refused there is never written
to history, so a bad one cannot wedge a workflow. A client's view of a workflow
(workflows/model/api.py) is excepted: it is never run, the workflow's own validators are."""

import ast
from pathlib import Path

WORKFLOWS = Path(__file__).parents[2] / "workflows"


def updates_without_validator(source: str) -> list[str]:
    tree = ast.parse(source)
    updates: set[str] = set()
    validated: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if isinstance(target, ast.Attribute) and target.attr == "update":
                updates.add(node.name)
            if (
                isinstance(target, ast.Attribute)
                and target.attr == "validator"
                and isinstance(target.value, ast.Name)
            ):
                validated.add(target.value.id)
    return sorted(updates - validated)


def test_every_update_handler_has_a_validator() -> None:
    missing = [
        f"{path.name}: {name}"
        for path in sorted(WORKFLOWS.rglob("*.py"))
        if not path.stem.endswith("api")
        for name in updates_without_validator(path.read_text())
    ]
    assert not missing, f"updates without a validator: {missing}"


def test_the_check_sees_a_missing_validator() -> None:
    source = (
        "class W:\n"
        "    @workflow.update(name='a')\n    def a(self, x): ...\n"
        "    @a.validator\n    def _a(self, x): ...\n"
        "    @workflow.update\n    def b(self, x): ...\n"
    )
    assert updates_without_validator(source) == ["b"]
