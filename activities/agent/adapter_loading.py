"""Loading and unloading a running engine's LoRA adapters through the endpoints its adapter
names (engines/adapter.py RuntimeAdapters), with its engine key.

What to change is decided from what the engine says it serves (its model list), never from
what was asked of it before: the call is idempotent, and a retry after an agent restart, or
after a change that half happened, still ends with the engine serving exactly what was asked.
An adapter whose path changed is unloaded and loaded again from the new path (vLLM refuses to
load a name it already serves).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from engines.adapter import RuntimeAdapters

# Loading reads the adapter's weights; a few seconds for the usual sizes, more on a busy CPU.
REQUEST_TIMEOUT_S = 120.0
# What an engine's refusal may add to an error message (it lands in workflow history).
MAX_DETAIL = 300


class AdapterRefused(Exception):
    """The engine refused to load or unload an adapter: the message says which and why."""


class ModelListUnavailable(AdapterRefused):
    """The engine did not list what it serves (one still loading answers 503, say)."""


class NoRuntimeAdapters(Exception):
    """The engine has no runtime endpoints: it was started without them (by an older agent, or
    with the variable unset), so only a restart changes its adapters."""


@dataclass(frozen=True)
class AdapterChanges:
    unload: list[str]
    load: list[tuple[str, str]]  # (name, path), in the order asked


def served_adapters(model_list: Any) -> dict[str, str]:
    """Name -> path of each adapter in an OpenAI model list as vLLM answers it: an entry with a
    `parent` (its base model) is an adapter, its `root` the path it was loaded from."""
    data = model_list.get("data") if isinstance(model_list, dict) else None
    served: dict[str, str] = {}
    for entry in data if isinstance(data, list) else []:
        if not isinstance(entry, dict) or not entry.get("parent"):
            continue
        name, root = entry.get("id"), entry.get("root")
        if isinstance(name, str) and isinstance(root, str):
            served[name] = root
    return served


def adapter_changes(served: Mapping[str, str], wanted: Mapping[str, str]) -> AdapterChanges:
    """What turns `served` into `wanted` (both name -> path): unload what is not wanted, or
    wanted from another path; then load what is missing."""
    unload = sorted(name for name, path in served.items() if wanted.get(name) != path)
    load = [(name, path) for name, path in wanted.items() if served.get(name) != path]
    return AdapterChanges(unload=unload, load=load)


def _said(response: httpx.Response) -> str:
    text = " ".join(response.text.split())
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


def _endpoint_missing(response: httpx.Response) -> bool:
    """A 404 from the web framework for a path it does not serve ({"detail": "Not Found"}), as
    opposed to the engine's own 404 for an adapter it does not know."""
    if response.status_code != 404:
        return False
    try:
        body = response.json()
    except ValueError:
        return True
    return isinstance(body, dict) and body.get("detail") == "Not Found"


async def set_adapters(
    base_url: str,
    engine_key: str,
    runtime: RuntimeAdapters,
    wanted: Mapping[str, str],
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> AdapterChanges:
    """Make the engine at `base_url` serve exactly `wanted` (name -> path on this node).
    Raises AdapterRefused (ModelListUnavailable when it lists nothing) or NoRuntimeAdapters,
    and httpx.HTTPError when it does not answer."""
    headers = {"Authorization": f"Bearer {engine_key}"}
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, headers=headers) as client:
        listing = await client.get(runtime.listing)
        if listing.status_code != 200:
            raise ModelListUnavailable(f"its model list answered HTTP {listing.status_code}")
        changes = adapter_changes(served_adapters(listing.json()), wanted)
        for name in changes.unload:
            response = await client.post(runtime.unload, json={"lora_name": name})
            if _endpoint_missing(response):
                raise NoRuntimeAdapters("the engine was started without runtime adapter loading")
            # The engine's own 404: it no longer serves it, which is what was asked.
            if response.status_code not in (200, 404):
                raise AdapterRefused(f"unloading adapter {name}: {_said(response)}")
        for name, path in changes.load:
            response = await client.post(runtime.load, json={"lora_name": name, "lora_path": path})
            if _endpoint_missing(response):
                raise NoRuntimeAdapters("the engine was started without runtime adapter loading")
            if response.status_code != 200:
                raise AdapterRefused(
                    f"loading adapter {name}: HTTP {response.status_code} {_said(response)}"
                )
    return changes
