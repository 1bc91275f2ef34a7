"""Reserved against measured: what an engine's processes hold (measured on real processes
here), exported on the agent's metrics, read back by the CLI and set beside what placement
reserved (`llmgw model resources`)."""

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from activities.agent import procfs
from activities.agent.engine_memory import EngineMemory, group_pids, measure
from activities.agent.node_metrics import EngineLoadSample, NodeReading, render
from activities.agent.readiness import ComputeApp
from workers.commands.model_resources import resource_rows, resources_table
from workers.node_telemetry import parse_agent_metrics
from workflows.contracts import (
    Allocation,
    EngineLoad,
    GpuInfo,
    LedgerState,
    NodeInventory,
    NodeRecord,
    NodeState,
    ShardAllocation,
)

MIB = 1024 * 1024
# A leader that forks a worker, each holding about 64 MiB it has written to (so resident).
ENGINE = """
import os, sys, time
held = bytearray(64 * 1024 * 1024)
if os.fork() == 0:
    again = bytearray(64 * 1024 * 1024)
print("up", flush=True)
time.sleep(60)
"""


@pytest.fixture
def engine() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", ENGINE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert process.stdout is not None
    process.stdout.readline()
    process.stdout.readline()  # both have printed
    try:
        yield process
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # its own group: the leader and its worker
        process.wait()


def test_an_engines_memory_is_its_whole_process_groups(engine: subprocess.Popen[str]) -> None:
    pids = group_pids(engine.pid)
    assert len(pids) == 2  # the leader and the worker it forked
    alone = procfs.rss_bytes(engine.pid)
    assert alone is not None
    assert alone > 64 * MIB
    measured = measure(engine.pid, [], None)
    assert measured.rss_bytes > 128 * MIB
    assert measured.rss_bytes > alone
    assert measured.gpu_memory_mb is None  # no GPUs


def test_gpu_memory_counts_the_groups_processes_on_the_shards_gpus(
    engine: subprocess.Popen[str],
) -> None:
    worker = next(pid for pid in group_pids(engine.pid) if pid != engine.pid)
    apps = [
        ComputeApp(pid=engine.pid, gpu_uuid="GPU-a", used_memory_mb=500),
        ComputeApp(pid=worker, gpu_uuid="GPU-b", used_memory_mb=300),
        ComputeApp(pid=worker, gpu_uuid="GPU-other", used_memory_mb=7000),  # not the shard's
        ComputeApp(pid=1, gpu_uuid="GPU-a", used_memory_mb=9000),  # not the engine's
    ]
    assert measure(engine.pid, ["GPU-a", "GPU-b"], apps).gpu_memory_mb == 800


def test_a_gone_process_measures_nothing() -> None:
    past_pid_max = 2**22 + 1  # Linux never hands out a pid above 2**22
    assert procfs.rss_bytes(past_pid_max) is None


def test_the_metrics_carry_it_and_the_cli_reads_it_back() -> None:
    load = EngineLoad(replica_id="chat-0", running=1)
    memory = EngineMemory(rss_bytes=900 * MIB, gpu_memory_mb=40000)
    reading = NodeReading(engines=[EngineLoadSample("chat-0", "vllm", load, memory)], read_at=1.0)
    figures = parse_agent_metrics(render("gpu-a", reading).decode(), "gpu-a")
    assert figures is not None
    (engine,) = figures.engines
    assert engine.rss_bytes == 900 * MIB
    assert engine.gpu_memory_bytes == 40000 * MIB


def ledger() -> LedgerState:
    gpu = GpuInfo(index=0, uuid="GPU-a", name="H100", gpu_class="h100-80g", memory_mb=81559)
    nodes = {
        "gpu-a": NodeRecord(
            inventory=NodeInventory(name="gpu-a", gpus=[gpu]), state=NodeState.READY
        ),
        "cpu-b": NodeRecord(inventory=NodeInventory(name="cpu-b"), state=NodeState.READY),
    }
    on_gpu = ShardAllocation(node="gpu-a", address="a", port=1, gpus=[0], memory_mb=4096)
    allocations = {
        "chat-0": Allocation(
            replica_id="chat-0", model="chat", node="gpu-a", address="a", port=1,
            cpu_cores=4, memory_mb=4096, shards=[on_gpu],
        ),
        "small-0": Allocation(
            replica_id="small-0", model="small", node="cpu-b", address="b", port=2,
            cpu_cores=2, memory_mb=1024,
        ),
    }  # fmt: skip
    return LedgerState(nodes=nodes, allocations=allocations)


def test_a_replica_using_more_than_it_reserved_is_flagged() -> None:
    load = EngineLoad(replica_id="small-0")
    over = EngineMemory(rss_bytes=1500 * MIB)
    reading = NodeReading(engines=[EngineLoadSample("small-0", "llamacpp", load, over)])
    figures = {
        "cpu-b": parse_agent_metrics(render("cpu-b", reading).decode(), "cpu-b"),
        "gpu-a": "its agent serves no metrics (llmgw agent --metrics-port)",
    }
    rows = resource_rows(ledger(), {k: v for k, v in figures.items() if v is not None})
    by_replica = {row.replica: row for row in rows}
    assert by_replica["small-0"].over() == ["memory 1500 MiB used of 1024 MiB"]
    assert by_replica["chat-0"].gpu_reserved_mb == 81559
    assert by_replica["chat-0"].unmeasured.startswith("its agent serves no metrics")
    text = resources_table(rows)
    assert "OVER: memory 1500 MiB used of 1024 MiB" in text
    assert "? / 81559 MiB" in text  # the GPU reserved, not measured
    assert [row.replica for row in resource_rows(ledger(), {}, model="chat")] == ["chat-0"]
