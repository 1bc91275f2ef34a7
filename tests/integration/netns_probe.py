"""The multi-host test's eyes inside the control host's namespace, where the test process itself
cannot reach: a long-lived process reading one JSON request a line on stdin and answering one
JSON line on stdout.

    {"op": "ledger"}                                   -> {"ledger": <LedgerState as JSON>}
    {"op": "http", "method": "GET", "url": U,
     "headers": {...}, "json": {...}}                  -> {"status": 200, "text": "..."}

A failed request answers {"error": "..."}; the probe keeps running. Run as
`python -m tests.integration.netns_probe TEMPORAL_ADDRESS`.
"""

import asyncio
import json
import os
import sys
from typing import Any

import httpx
from temporalio.client import Client

from workers.progress import ledger_snapshot
from workflows.client import connect


async def answer(request: dict[str, Any], temporal: str, clients: dict[str, Client]) -> Any:
    if request["op"] == "ledger":
        if "temporal" not in clients:
            clients["temporal"] = await connect(temporal)
        state = await ledger_snapshot(clients["temporal"])
        return {"ledger": state.model_dump(mode="json")}
    if request["op"] == "http":
        async with httpx.AsyncClient(timeout=request.get("timeout", 10)) as http:
            reply = await http.request(
                request.get("method", "GET"),
                request["url"],
                headers=request.get("headers"),
                json=request.get("json"),
            )
        return {"status": reply.status_code, "text": reply.text}
    return {"error": f"unknown op {request['op']!r}"}


async def main(temporal: str) -> None:
    # Answers go to the stdout this process was given; anything else that writes to fd 1 (the
    # Temporal client's Rust core logs there) goes to stderr, the log.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    clients: dict[str, Client] = {}
    while line := await asyncio.to_thread(sys.stdin.readline):
        try:
            reply = await answer(json.loads(line), temporal, clients)
        except Exception as err:  # noqa: BLE001 - every failure is an answer; the test judges it
            reply = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(reply), file=answers, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
