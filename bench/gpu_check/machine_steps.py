"""The GPU check's first steps, which run on any machine: the agent's discovery (recorded as a
machine fixture and read back from it), `llmgw agent inventory` and `llmgw doctor`."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from activities.agent.discovery import discover_inventory
from activities.agent.fabric_parsing import parse_ip_addr
from activities.agent.nvml_source import run_command
from bench.gpu_check.fixture_loader import differences, discover_fixture
from bench.gpu_check.recorder import (
    MachineSources,
    anonymous_machine_id,
    record_machine,
    steady_view,
    write_expected,
)
from bench.gpu_check.runner import Failed
from bench.gpu_check.state import CheckState
from workflows.contracts import NodeInventory

CLI_TIMEOUT_S = 120.0


def default_address() -> str:
    """This machine's first IPv4 address that is not loopback, as an operator would give the
    agent (so the fixture records its management interface); 127.0.0.1 when it has none."""
    done = run_command(["ip", "-o", "-4", "addr", "show"])
    if done.returncode == 0:
        for _name, address in parse_ip_addr(done.stdout):
            if not address.startswith("127."):
                return address
    return "127.0.0.1"


def fixture_name(inventory: NodeInventory) -> str:
    """A name in the fixtures' style from what was found: `h100_80g_x1_recorded`,
    `cpu_x86_64_recorded`."""
    cards = Counter(g.gpu_class for g in inventory.gpus if g.mig is None and g.gpu_class)
    if cards:
        gpu_class, count = cards.most_common(1)[0]
        stem = f"{gpu_class.replace('-', '_')}_x{count}"
    else:
        stem = f"cpu_{inventory.arch or 'unknown'}"
    return f"{stem}_recorded"


def free_name(machines: Path, stem: str) -> str:
    """`stem`, or `stem_2`, `stem_3`, ...: a recording never overwrites another."""
    name, number = stem, 1
    while (machines / name).exists():
        number += 1
        name = f"{stem}_{number}"
    return name


def describe(inventory: NodeInventory) -> str:
    if not inventory.gpus:
        return f"no NVIDIA GPU: a CPU node, {inventory.cpu_cores} CPUs {inventory.cpu_model}"
    names = Counter(g.name for g in inventory.gpus)
    cards = ", ".join(f"{n} x {name}" for name, n in names.items())
    return f"{cards}, driver {inventory.nvidia_driver}, CUDA {inventory.cuda_version}"


async def discovery(state: CheckState) -> str:
    """Discovery live; the fixture recorded; the fixture read back gives the same inventory."""
    inventory = await asyncio.to_thread(discover_inventory, state.node, state.address)
    state.inventory = inventory
    name = state.name or free_name(state.machines, fixture_name(inventory))
    state.fixture = state.machines / name
    await asyncio.to_thread(
        record_machine, state.fixture, inventory, MachineSources(), {"machine": name}
    )
    loaded = await asyncio.to_thread(discover_fixture, state.fixture, state.node)
    write_expected(state.fixture, loaded)
    live = inventory.model_copy(update={"machine_id": anonymous_machine_id(inventory.machine_id)})
    missing = differences(steady_view(live), steady_view(loaded))
    if missing:
        raise Failed(f"the fixture {name} does not reproduce discovery: {'; '.join(missing)}")
    if inventory.problems:
        raise Failed(f"discovery reported problems: {'; '.join(inventory.problems)}")
    return f"{describe(inventory)}; fixture {name} reproduces it"


async def llmgw_command(state: CheckState, *args: str) -> tuple[int, str]:
    """The real `llmgw` command beside this Python, in a state dir of the run's own."""
    llmgw = Path(sys.executable).parent / "llmgw"
    argv = [str(llmgw), *args, "--node", state.node, "--address", state.address]
    argv += ["--state-dir", str(state.out / "state")]
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), CLI_TIMEOUT_S)
    except BaseException:
        if process.returncode is None:
            process.kill()
        raise
    if err.strip():
        (state.out / f"{'_'.join(args[:2])}.stderr").write_bytes(err)
    return process.returncode or 0, out.decode(errors="replace")


def _same_gpus(state: CheckState, reported: dict[str, Any], what: str) -> None:
    assert state.inventory is not None
    expected = [g.uuid for g in state.inventory.gpus]
    found = [g.get("uuid") for g in reported.get("gpus", [])]
    if found != expected:
        raise Failed(f"{what} lists GPUs {found}, discovery {expected}")


async def agent_inventory(state: CheckState) -> str:
    code, out = await llmgw_command(state, "agent", "inventory", "--json")
    (state.out / "agent_inventory.json").write_text(out)
    if code != 0:
        raise Failed(f"llmgw agent inventory exited {code}")
    record = json.loads(out)
    _same_gpus(state, record["inventory"], "llmgw agent inventory")
    _code, text = await llmgw_command(state, "agent", "inventory")
    (state.out / "agent_inventory.txt").write_text(text)
    placeable = [line.strip() for line in text.splitlines() if "placeable" in line]
    return f"{len(record['inventory']['gpus'])} GPU(s) as discovery; {'; '.join(placeable)}"


async def doctor(state: CheckState) -> str:
    """`llmgw doctor --json` runs and speaks of the GPUs discovery found. What it finds wrong
    with the machine is reported in the detail, not failed: it is the machine's state, which
    the fixture records, not this code's."""
    code, out = await llmgw_command(state, "doctor", "--json")
    (state.out / "doctor.json").write_text(out)
    if code not in (0, 1):
        raise Failed(f"llmgw doctor exited {code}")
    document = json.loads(out)
    _same_gpus(state, document["facts"]["inventory"], "llmgw doctor")
    _code, text = await llmgw_command(state, "doctor")
    (state.out / "doctor.txt").write_text(text)
    findings = document["findings"]
    counts = Counter(f["severity"] for f in findings)
    failing = [f"{f['check']}: {f['message']}" for f in findings if f["severity"] == "fail"]
    summary = f"exit {code}, {counts['fail']} fail, {counts['warn']} warn"
    return summary + (f" ({'; '.join(failing)})" if failing else "")
