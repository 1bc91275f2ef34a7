"""How a shard is launched beyond vLLM: SGLang and TensorRT-LLM command lines, the per-shard
environment (GPUs by UUID, each node's own address, NCCL per fabric, forbidden env dropped),
the env policy, the GPU-memory readiness check, and the launcher that runs sidecars."""

import json
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from activities.agent.launch_plan import LAUNCHER, launch_argv
from activities.agent.readiness import gpu_memory_problem, gpus_without_memory, parse_compute_apps
from engines import sglang, trtllm
from engines.adapter import ShardLaunch
from engines.commands import Command, ShardPlace
from engines.nccl_env import FabricUnavailableError
from engines.registry import adapter
from engines.shard_env import shard_env
from workflows.contracts import (
    GpuFabric,
    GpuInfo,
    LoraAdapter,
    ModelSpec,
    NetworkPort,
    NodeInventory,
    Profile,
)
from workflows.env_policy import forbidden_env

MODEL = ModelSpec(name="big", weights="/models/big", profiles=[Profile(engine="sglang")])


def pairs(argv: list[str]) -> dict[str, str]:
    return {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}


# --- SGLang and TensorRT-LLM ---------------------------------------------------------------


def test_sglang_multi_node_and_key_off_the_command_line() -> None:
    p = Profile(
        engine="sglang",
        gpu_class="h100-80g",
        gpus_per_node=8,
        tensor_parallel=16,
        nodes=2,
        lora=[LoraAdapter(name="sql", path="/a/sql")],
    )
    place = ShardPlace(
        address="10.0.0.2",
        port=18002,
        rank=1,
        nodes=2,
        leader_address="10.0.0.1",
        rendezvous_port=28001,
    )
    argv = sglang.command_line("/e/venv/bin/python", MODEL, p, place)
    assert argv[:3] == ["/e/venv/bin/python", "-I", "-c"]
    flags = pairs(argv[4:])
    assert flags["--model-path"] == "/models/big"
    assert flags["--host"] == "10.0.0.2"
    assert flags["--port"] == "18002"
    assert flags["--tp"] == "16"
    assert flags["--nnodes"] == "2"
    assert flags["--node-rank"] == "1"
    assert flags["--dist-init-addr"] == "10.0.0.1:28001"
    assert flags["--lora-paths"] == "sql=/a/sql"
    assert "--api-key" not in argv
    assert sglang.engine_env("k")["SGLANG_API_KEY"] == "k"
    with pytest.raises(ValueError, match="llmgw sets them itself"):
        sglang.command_line("py", MODEL, p.model_copy(update={"args": ["--api-key", "x"]}), place)


def test_sglang_launcher_hands_the_key_to_the_server_not_to_its_argv() -> None:
    # The launcher's code with a stand-in for sglang.launch_server: it prints its sys.argv and
    # whether the key is still in its environment.
    code = sglang.LAUNCHER.replace(
        "runpy.run_module('sglang.launch_server', run_name='__main__', alter_sys=True)",
        "print(sys.argv[1:], 'SGLANG_API_KEY' in os.environ)",
    )
    assert code != sglang.LAUNCHER
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, "--port", "1"],
        env={"SGLANG_API_KEY": "sekrit"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "['--port', '1', '--api-key', 'sekrit'] False"


def test_trtllm_single_node() -> None:
    p = Profile(engine="trtllm", gpu_class="h100-80g", gpus_per_node=2, tensor_parallel=2)
    argv = trtllm.command_line(
        "/t/bin/trtllm-serve", MODEL, p, ShardPlace(address="10.0.0.1", port=18001), 18002
    )
    assert argv[:2] == ["/t/bin/trtllm-serve", "/models/big"]
    flags = pairs(argv)
    assert (flags["--host"], flags["--port"]) == ("127.0.0.1", "18002")  # behind its key guard
    assert flags["--tp_size"] == "2"
    with pytest.raises(ValueError, match="one node"):
        trtllm.command_line("t", MODEL, p, ShardPlace(address="a", port=1, nodes=2), 2)


# --- per-shard environment -----------------------------------------------------------------


def inventory(**kw: object) -> NodeInventory:
    fields: dict[str, object] = {
        "name": "n2",
        "address": "10.0.0.2",
        "management_interface": "eth0",
        "network_ports": [
            NetworkPort(device="mlx5_0", link_layer="InfiniBand", state="4: ACTIVE"),
            NetworkPort(
                device="mlx5_1", link_layer="Ethernet", state="4: ACTIVE", roce_v2_gid_index=3
            ),
        ],
    }
    fields.update(kw)
    return NodeInventory.model_validate(fields)


def test_gpus_by_uuid_mig_included_and_cpu_shards_see_none() -> None:
    gpu = shard_env(gpu_uuids=["GPU-aa", "GPU-bb"], profile_env={})
    assert gpu.env["CUDA_VISIBLE_DEVICES"] == "GPU-aa,GPU-bb"
    assert gpu.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    mig = shard_env(gpu_uuids=["MIG-4f1c-77"], profile_env={})
    assert mig.env["CUDA_VISIBLE_DEVICES"] == "MIG-4f1c-77"
    cpu = shard_env(gpu_uuids=[], profile_env={})
    assert cpu.env["CUDA_VISIBLE_DEVICES"] == ""
    # One node: NCCL finds NVLink and PCIe itself.
    assert not any(k.startswith("NCCL_") for k in gpu.env)


def test_vllm_host_ip_is_each_nodes_own() -> None:
    p = Profile(engine="vllm", gpu_class="h100-80g", gpus_per_node=8, tensor_parallel=16, nodes=2)
    for rank, own in enumerate(("10.0.0.1", "10.0.0.2")):
        place = ShardPlace(address=own, port=18001, rank=rank, nodes=2, leader_address="10.0.0.1")
        launch = ShardLaunch("big-0", MODEL, p, place, {}, Path("/e/venv/bin/vllm"), key="k")
        assert adapter("vllm").environment(launch)["VLLM_HOST_IP"] == own
        sgl = replace(launch, profile=p.model_copy(update={"engine": "sglang"}))
        assert "VLLM_HOST_IP" not in adapter("sglang").environment(sgl)
    # The adapter's, not shard_env's, which is the same for every engine.
    shard = shard_env(gpu_uuids=["GPU-x"], profile_env={}, nodes=2, inventory=inventory())
    assert "VLLM_HOST_IP" not in shard.env


def test_nccl_by_fabric() -> None:
    def env(fabric: str, inv: NodeInventory) -> dict[str, str]:
        return shard_env(
            gpu_uuids=["GPU-x"],
            profile_env={},
            nodes=2,
            fabric=fabric,
            inventory=inv,
        ).env

    ib = env("infiniband", inventory())
    assert ib["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert "NCCL_IB_GID_INDEX" not in ib
    assert ib["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert ib["GLOO_SOCKET_IFNAME"] == "eth0"
    roce = env("roce", inventory())
    assert roce["NCCL_IB_HCA"] == "=mlx5_1:1"
    assert roce["NCCL_IB_GID_INDEX"] == "3"
    joined = GpuFabric(state="Completed", status="Success", cluster_uuid="c0ffee00-1", clique_id=7)
    card = GpuInfo(
        index=0, uuid="GPU-x", name="GB200", gpu_class="gb200-186g", memory_mb=1, fabric=joined
    )
    assert env("nvlink", inventory(gpus=[card]))["NCCL_MNNVL_ENABLE"] == "1"
    assert env("", inventory())["NCCL_IB_DISABLE"] == "1"  # multi-node with no fabric: sockets
    with pytest.raises(FabricUnavailableError):
        env("nvlink", inventory())
    with pytest.raises(ValueError, match="inventory"):
        shard_env(gpu_uuids=[], profile_env={}, nodes=2, fabric="roce")


def test_profile_env_last_but_forbidden_dropped_with_reasons() -> None:
    given = {
        "NCCL_DEBUG": "INFO",
        "VLLM_ATTENTION_BACKEND": "FLASHINFER",
        "LD_PRELOAD": "/tmp/evil.so",
        "PYTHONPATH": "/tmp",
        "PATH": "/tmp",
        "BASH_ENV": "/tmp/rc",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "VLLM_HOST_IP": "10.0.0.1",
    }
    shard = shard_env(gpu_uuids=["GPU-x"], profile_env=given)
    assert shard.env["NCCL_DEBUG"] == "INFO"
    assert shard.env["VLLM_ATTENTION_BACKEND"] == "FLASHINFER"
    assert shard.env["CUDA_VISIBLE_DEVICES"] == "GPU-x"
    assert "VLLM_HOST_IP" not in shard.env  # llmgw's own comes from the vLLM adapter
    assert set(shard.dropped) == {
        "LD_PRELOAD",
        "PYTHONPATH",
        "PATH",
        "BASH_ENV",
        "CUDA_VISIBLE_DEVICES",
        "VLLM_HOST_IP",
    }
    assert "changes what runs" in shard.dropped["LD_PRELOAD"]
    assert "placement chose" in shard.dropped["CUDA_VISIBLE_DEVICES"]
    for name in shard.dropped:
        assert name not in shard.env or shard.env[name] != given[name]


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONBREAKPOINT",
        "PYTHONWARNINGS",
        "BASH_ENV",
        "ENV",
        "PERL5OPT",
        "NODE_OPTIONS",
        "RUBYOPT",
        "JAVA_TOOL_OPTIONS",
        "GCONV_PATH",
        "CUDA_INJECTION64_PATH",
        "NCCL_NET_PLUGIN",
        "OPENSSL_CONF",
        "VLLM_API_KEY",
        "PYTHONHASHSEED",
        "NCCL_IB_HCA",
        "BAD-NAME",
        "",
    ],
)
def test_forbidden(name: str) -> None:
    assert forbidden_env(name)


@pytest.mark.parametrize(
    "name",
    ["NCCL_DEBUG", "OMP_NUM_THREADS", "HF_HOME", "VLLM_ATTENTION_BACKEND", "PYTHONUNBUFFERED"],
)
def test_allowed(name: str) -> None:
    assert forbidden_env(name) is None


# --- GPU memory readiness ------------------------------------------------------------------

# `nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits`
SMI = """\
4101, GPU-5b2c1a6e-0d3f-4f39-9f0e-1a2b3c4d5e6f, 40511
4102, GPU-77aa0000-1111-2222-3333-444455556666, 39870
5000, MIG-4f1c2d3e-aaaa-bbbb-cccc-0123456789ab, 9800
6000, GPU-77aa0000-1111-2222-3333-444455556666, [N/A]
"""


def test_compute_apps_parser() -> None:
    apps = parse_compute_apps(SMI + "\nNo running processes found\n")
    assert [(a.pid, a.used_memory_mb) for a in apps] == [
        (4101, 40511),
        (4102, 39870),
        (5000, 9800),
        (6000, 0),
    ]
    assert apps[2].gpu_uuid.startswith("MIG-")
    assert parse_compute_apps("") == []


def test_every_gpu_must_hold_memory_of_the_shards_group() -> None:
    a, b = "GPU-5b2c1a6e-0d3f-4f39-9f0e-1a2b3c4d5e6f", "GPU-77aa0000-1111-2222-3333-444455556666"
    apps = parse_compute_apps(SMI)
    assert gpus_without_memory(apps, [a, b], {4100, 4101, 4102}) == []
    # A process outside the shard's group holding the card does not count.
    assert gpus_without_memory(apps, [a, b], {4101, 9999}) == [b]
    # Unreadable memory does not count either.
    assert gpus_without_memory(apps, [b], {6000}) == [b]
    assert gpu_memory_problem(["MIG-4f1c2d3e-aaaa-bbbb-cccc-0123456789ab"], {5000}, SMI) == ""
    problem = gpu_memory_problem([a], {1}, "")  # computing on the CPU, or nvidia-smi failing
    assert a in problem
    assert "CPU" in problem


# --- the launcher: sidecars in the shard's group, waits, exit of the last ------------------


def test_one_command_runs_as_itself() -> None:
    assert launch_argv([Command(["llama-server", "--port", "1"])]) == [
        "llama-server",
        "--port",
        "1",
    ]
    argv = launch_argv([Command(["ray", "start"]), Command(["vllm", "serve"], wait_for=("h", 1))])
    assert argv[:3] == [sys.executable, "-I", str(LAUNCHER)]
    plan = json.loads(argv[3])
    assert plan["commands"][1] == {"argv": ["vllm", "serve"], "wait_for": ["h", 1]}


def run_launcher(commands: list[Command], wait_s: float = 10.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        launch_argv(commands, wait_s),
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        check=False,
    )


def test_sidecar_waits_and_dies_with_the_engine() -> None:
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        port = head.getsockname()[1]
        sidecar = [sys.executable, "-c", "import time; time.sleep(60)"]
        engine = [sys.executable, "-c", "import os, sys; print('pg', os.getpgrp()); sys.exit(7)"]
        started = time.monotonic()
        done = run_launcher([Command(sidecar), Command(engine, wait_for=("127.0.0.1", port))])
    assert done.returncode == 7, done.stdout + done.stderr
    assert time.monotonic() - started < 30  # the sidecar was stopped, not waited out
    assert "starting sidecar" in done.stdout
    assert "engine exited with 7" in done.stdout


def test_rendezvous_that_never_listens_fails_the_shard() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening
        done = run_launcher([Command(["true"], wait_for=("127.0.0.1", port))], wait_s=0.5)
    assert done.returncode == 1
    assert "was not listening" in done.stdout


def test_engine_killed_by_a_signal_is_reported_as_that_signal() -> None:
    engine = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    done = run_launcher(
        [Command([sys.executable, "-c", "import time; time.sleep(60)"]), Command(engine)]
    )
    assert done.returncode == -9


def test_a_dead_sidecar_ends_the_shard() -> None:
    done = run_launcher(
        [
            Command([sys.executable, "-c", "pass"]),
            Command([sys.executable, "-c", "import time; time.sleep(60)"]),
        ]
    )
    assert done.returncode == 1
    assert "stopping the shard" in done.stdout


def test_a_command_is_started_without_the_environment_it_drops() -> None:
    # A TensorRT-LLM shard's key is its guard's alone: trtllm-serve is started without it.
    assert json.loads(launch_argv([Command(["x"], env_drop=("K",))])[3])["commands"] == [
        {"argv": ["x"], "wait_for": None, "env_drop": ["K"]}
    ]
    has_key = "import os, sys, time; print(os.environ.get('LLMGW_T_KEY'), flush=True); "
    sidecar = has_key + "sys.exit(4) if 'LLMGW_T_KEY' not in os.environ else time.sleep(60)"
    engine = has_key + "time.sleep(1); sys.exit(3 if 'LLMGW_T_KEY' in os.environ else 0)"
    done = subprocess.run(
        launch_argv(
            [
                Command([sys.executable, "-c", sidecar]),
                Command([sys.executable, "-c", engine], env_drop=("LLMGW_T_KEY",)),
            ],
            10.0,
        ),
        env={"LLMGW_T_KEY": "sekrit", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr  # the engine had no key, the sidecar had
    lines = done.stdout.splitlines()
    assert "sekrit" in lines  # the sidecar's
    assert "None" in lines  # the engine's
