"""workflows/model/api.py, the model workflow as its clients see it, against ModelWorkflow: the
same type name, and every message a client can send under the same name with the same
parameter and result types. A handler renamed or retyped in one and not the other fails here,
not in a cluster where the client's call would miss."""

from collections.abc import Callable
from typing import Any, get_type_hints

import pytest
from temporalio import workflow

from workflows.model.api import ModelApi
from workflows.model.workflow import ModelWorkflow


def types_of(fn: Callable[..., Any]) -> dict[str, Any]:
    return get_type_hints(fn)


def definition(cls: type) -> Any:
    return workflow._Definition.must_from_class(cls)


def test_the_api_names_the_workflows_type() -> None:
    assert definition(ModelApi).name == definition(ModelWorkflow).name == "Model"
    assert types_of(ModelApi.run) == types_of(ModelWorkflow.run)


def test_every_message_of_the_api_is_the_workflows_with_the_same_types() -> None:
    api, real = definition(ModelApi), definition(ModelWorkflow)
    kinds = {"signal": "signals", "query": "queries", "update": "updates"}
    checked = 0
    for kind, attribute in kinds.items():
        for name, handler in getattr(api, attribute).items():
            assert name in getattr(real, attribute), f"ModelWorkflow has no {kind} {name!r}"
            assert types_of(handler.fn) == types_of(getattr(real, attribute)[name].fn), name
            checked += 1
    assert checked >= 6  # apply, scale, remove, replace, wake, describe


def test_the_api_is_not_a_workflow_a_worker_can_run() -> None:
    """Registered by mistake, it fails loudly instead of answering as a model."""
    with pytest.raises(NotImplementedError, match="ModelWorkflow"):
        ModelApi().describe()
