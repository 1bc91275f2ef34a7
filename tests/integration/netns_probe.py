"""The multi-host test's eyes inside the control host's namespace, where the test process itself
cannot reach: a long-lived process reading one JSON request a line on stdin and answering one
JSON line on stdout.

    {"op": "ledger"}                                   -> {"ledger": <LedgerState as JSON>}
                                                          (the fleet tables' snapshot)
    {"op": "http", "method": "GET", "url": U,
     "headers": {...}, "json": {...}}                  -> {"status": 200, "text": "..."}

A failed request answers {"error": "..."}; the probe keeps running. Run as
`python -m tests.integration.netns_probe` with the control host's environment: the fleet tables
are read from the store LLMGW_STATE_DIR (or LLMGW_DATABASE_URL) names, as `llmgw` would.
"""

import asyncio
import json
import os
import sys
from typing import Any

import httpx

from store.fleet import FleetTables
from workers.paths import Locations
from workers.progress import fleet_tables, ledger_snapshot


async def answer(request: dict[str, Any], opened: list[FleetTables]) -> Any:
    if request["op"] == "ledger":
        if not opened:
            opened.append(await fleet_tables(Locations.resolve()))
        state = await ledger_snapshot(opened[0])
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


async def main() -> None:
    # Answers go to the stdout this process was given; anything else that writes to fd 1 (the
    # Temporal client's Rust core logs there) goes to stderr, the log.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    opened: list[FleetTables] = []
    while line := await asyncio.to_thread(sys.stdin.readline):
        try:
            reply = await answer(json.loads(line), opened)
        except Exception as err:  # noqa: BLE001 - every failure is an answer; the test judges it
            reply = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(reply), file=answers, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
