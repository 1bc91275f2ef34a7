"""`llmgw doctor`: for each kind of machine, what the operator reads and the exit status.

The machines are NodeInventory objects shaped like the recorded fixtures (h100_sxm_x8,
gb200_nvl72_tray, roce_node, ...), with the doctor's own facts beside them. `run` is called
with gather_facts replaced, so the text, the JSON and the exit status are the real command's.
"""

from __future__ import annotations

import json

import pytest

from activities.agent.doctor.checks import diagnose
from activities.agent.doctor.facts import (
    CommandProbe,
    DoctorFacts,
    EngineCheck,
    MemlockLimit,
)
from activities.agent.doctor.findings import Finding, Severity
from tests.machine_tools import by_check, run_doctor
from tests.unit.doctor_machines import (
    NVL72_UUID,
    cpu_node,
    facts_for,
    gb200_tray,
    gpu,
    h100_sxm_x8,
    ib_port,
    inventory,
    llamacpp_ok,
    roce_port,
)
from workflows.contracts import (
    GpuFabric,
    GpuProcess,
    ImexInfo,
    MigInstance,
)

# --- running the command -------------------------------------------------------------------


def severities(findings: list[Finding]) -> set[Severity]:
    return {f.severity for f in findings}


# --- per machine ---------------------------------------------------------------------------


def test_h100_with_fabric_manager_inactive_fails_first_with_the_systemctl_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = facts_for(
        h100_sxm_x8(fabric_state="In Progress", status="N/A"), fabric_manager="inactive"
    )
    findings = diagnose(facts)
    first = findings[0]
    assert (first.severity, first.check) == (Severity.FAIL, "fabric-manager")
    assert "inactive" in first.message
    assert "systemctl enable --now nvidia-fabricmanager" in first.fix
    assert "550.54.15" in first.fix  # the fabric manager must match the driver
    # The GPUs' own fabric state is the consequence, said after the cause.
    assert findings[1].check == "nvlink-fabric"
    assert "GPUs 0, 1, 2, 3, 4, 5, 6, 7" in findings[1].message

    code, out = run_doctor(monkeypatch, capsys, facts)
    assert code == 1
    body = out.splitlines()
    assert body[0].startswith("node node-a (10.0.0.5): 8 x NVIDIA H100 80GB HBM3")
    assert "NVSwitch" in body[0]
    assert body[2].startswith("FAIL  fabric-manager: NVSwitch present")
    assert body[3].strip().startswith("fix: `sudo systemctl enable --now nvidia-fabricmanager`")


def test_healthy_h100_node_passes_and_shows_the_infiniband_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = facts_for(h100_sxm_x8())
    findings = diagnose(facts)
    assert Severity.FAIL not in severities(findings)
    assert Severity.WARN not in severities(findings)
    assert by_check(findings, "fabric-manager")[0].severity == Severity.OK
    # A single machine's NVSwitch is no multi-node domain: no IMEX demanded.
    assert not by_check(findings, "imex")

    code, out = run_doctor(monkeypatch, capsys, facts)
    assert code == 0
    assert "INFO  driver: NVIDIA driver 550.54.15, CUDA 12.4" in out
    hca = "=" + ",".join(f"mlx5_{i}:1" for i in range(8))
    assert "NCCL environment for a shard over infiniband:\n  CUDA_DEVICE_ORDER=PCI_BUS_ID" in out
    assert f"  NCCL_IB_HCA={hca}\n" in out
    assert "NCCL_SOCKET_IFNAME==eno1" in out
    assert "over nvlink" not in out  # no domain, no MNNVL


def test_ecc_errors_fail_for_that_gpu_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = inventory(
        nvidia_driver="550.54.15",
        cuda_version="12.4",
        gpus=[
            gpu(0),
            gpu(1, ecc_uncorrected=12, unusable="12 uncorrected ECC errors"),
        ],
    )
    facts = facts_for(inv)
    findings = diagnose(facts)
    assert findings[0].severity == Severity.FAIL
    assert findings[0].check == "gpu-ecc"
    assert findings[0].message.startswith("GPU 1 ")
    assert "12 uncorrected ECC errors" in findings[0].message
    assert "nvidia-smi -r -i 1" in findings[0].fix
    assert len(by_check(findings, "gpu-ecc")) == 1  # GPU 0 is fine
    assert not by_check(findings, "gpu-unusable")  # said once, as ECC

    code, out = run_doctor(monkeypatch, capsys, facts)
    assert code == 1
    assert "FAIL  gpu-ecc: GPU 1" in out


def test_roce_port_without_v2_gid_fails_and_is_left_out_of_nccl_ib_hca(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = inventory(
        nvidia_driver="550.54.15",
        cuda_version="12.4",
        gpus=[gpu(0), gpu(1)],
        network_ports=[
            roce_port("mlx5_0", "ens1f0np0", gid=3),
            roce_port("mlx5_1", "ens1f1np1", gid=None),
        ],
    )
    facts = facts_for(inv)
    findings = diagnose(facts)
    gid = by_check(findings, "roce-gid")
    assert [f.severity for f in gid] == [Severity.FAIL, Severity.OK]
    assert "mlx5_1/1 (RoCE, ens1f1np1)" in gid[0].message
    assert "link-local" in gid[0].message
    assert "give ens1f1np1 an IPv4 address" in gid[0].fix
    assert findings[0] == gid[0]

    code, out = run_doctor(monkeypatch, capsys, facts)
    assert code == 1
    assert "  NCCL_IB_HCA==mlx5_0:1\n  NCCL_IB_GID_INDEX=3\n" in out


def test_infiniband_node_with_limited_memlock_and_missing_modules(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = inventory(
        nvidia_driver="550.54.15",
        cuda_version="12.4",
        gpus=[gpu(0)],
        network_ports=[
            ib_port("mlx5_0", counters={"symbol_error": 17, "port_xmit_data": 123456789}),
            ib_port("mlx5_1", state="INIT"),
        ],
    )
    facts = facts_for(
        inv,
        kernel_modules=["ib_core", "mlx5_core", "mlx5_ib", "nvidia", "nvidia_uvm"],
        memlock=MemlockLimit(soft_bytes=65536, hard_bytes=65536, source="llmgw agent pid 4242"),
    )
    findings = diagnose(facts)
    fails = [f for f in findings if f.severity == Severity.FAIL]
    assert {f.check for f in fails} == {"rdma-modules", "memlock"}
    modules = by_check(fails, "rdma-modules")[0]
    assert "ib_uverbs" in modules.message
    assert "sudo modprobe ib_uverbs" in modules.fix
    memlock = by_check(fails, "memlock")[0]
    assert "llmgw agent pid 4242 is 64 KiB" in memlock.message
    assert "LimitMEMLOCK=infinity" in memlock.fix
    assert "ulimit -l unlimited" in memlock.fix

    warns = [f for f in findings if f.severity == Severity.WARN]
    port = by_check(warns, "rdma-port")[0]
    assert "mlx5_1/1 (InfiniBand) is INIT" in port.message
    assert "subnet manager" in port.fix
    counters = by_check(warns, "rdma-counters")[0]
    assert "symbol_error=17" in counters.message
    assert "port_xmit_data" not in counters.message  # traffic is not an error
    assert by_check(warns, "gpudirect")[0].fix.startswith("`sudo modprobe nvidia-peermem`")

    code, out = run_doctor(monkeypatch, capsys, facts)
    assert code == 1
    # The down port is not listed for NCCL: only the active adapter.
    assert "NCCL_IB_HCA==mlx5_0:1\n" in out


def test_cpu_vm_without_avx2_warns_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = cpu_node(cpu_model="QEMU Virtual CPU version 2.5+", cpu_flags=["fma"])
    facts = facts_for(inv)
    findings = diagnose(facts)
    assert findings[0].severity == Severity.WARN
    assert findings[0].check == "avx2"
    assert "QEMU Virtual CPU" in findings[0].message
    assert "host-passthrough" in findings[0].fix

    code, out = run_doctor(monkeypatch, capsys, facts)
    assert code == 0
    assert "WARN  avx2:" in out


def test_healthy_cpu_node_exits_0_and_says_it_is_a_cpu_node(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = facts_for(cpu_node())
    findings = diagnose(facts)
    assert Severity.FAIL not in severities(findings)
    assert Severity.WARN not in severities(findings)
    cpu = by_check(findings, "gpus")[0]
    assert (cpu.severity, cpu.message.split(":")[0]) == (Severity.INFO, "CPU node")

    code, out = run_doctor(monkeypatch, capsys, facts)
    assert code == 0
    assert "no NVIDIA GPU" in out.splitlines()[0]
    assert "OK    engine: llamacpp 11434.0.0 runs: version: 11434 (abc1234)" in out
    assert "NCCL environment for a shard over socket:" in out
    assert "NCCL_IB_DISABLE=1" in out


def test_arm_cpu_node_is_not_asked_for_avx2() -> None:
    inv = cpu_node(arch="aarch64", cpu_flags=["asimd", "neon"])
    assert not by_check(diagnose(facts_for(inv)), "avx2")


def test_engine_that_cannot_run_fails_with_the_verification_detail(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = EngineCheck(
        engine="llamacpp",
        version="11434.0.0",
        path="/var/lib/llmgw/engines/llamacpp/11434.0.0/llama-server",
        runnable=False,
        detail="llama-server cannot start: missing libraries libgomp.so.1",
    )
    facts = facts_for(cpu_node(), engines=[broken])
    code, out = run_doctor(monkeypatch, capsys, facts)
    assert code == 1
    assert "FAIL  engine: llamacpp 11434.0.0 is installed but cannot run: llama-server" in out
    assert "missing libraries libgomp.so.1" in out


def test_an_engine_that_needs_a_gpu_on_a_cpu_node_is_not_told_to_install_libraries() -> None:
    sglang = EngineCheck(
        engine="sglang",
        version="0.5.23",
        path="/var/lib/llmgw/engines/sglang/0.5.23/venv/bin/python",
        runnable=False,
        detail="SGLang needs an NVIDIA GPU: SGLang's CPU engine needs sgl-kernel's CPU build",
    )
    (finding,) = by_check(diagnose(facts_for(cpu_node(), engines=[sglang])), "engine")
    assert finding.severity == Severity.FAIL
    assert "cannot run here: SGLang needs an NVIDIA GPU" in finding.message
    assert "install what it lacks" not in finding.fix
    assert "--disable-engine sglang" in finding.fix


def test_no_engine_installed_fails_naming_the_state_dir() -> None:
    findings = diagnose(facts_for(cpu_node(), engines=[]))
    assert findings[0].severity == Severity.FAIL
    assert "/var/lib/llmgw/engines" in findings[0].message
    assert "--engine-path" in findings[0].fix


def test_unfinished_install_beside_a_working_version_is_only_a_warning() -> None:
    leftover = EngineCheck(
        engine="llamacpp",
        version="11500.0.0",
        path="/var/lib/llmgw/engines/llamacpp/11500.0.0",
        marker=False,
        runnable=False,
        detail="no install marker: the install did not finish or failed",
    )
    findings = diagnose(facts_for(cpu_node(), engines=[llamacpp_ok(), leftover]))
    engine = by_check(findings, "engine")
    assert [f.severity for f in engine] == [Severity.WARN, Severity.OK]
    assert "11500.0.0 is not installed" in engine[0].message
    alone = diagnose(facts_for(cpu_node(), engines=[leftover]))
    assert by_check(alone, "engine")[0].severity == Severity.FAIL


def test_mig_card_with_nothing_carved_warns_and_carved_cards_are_listed() -> None:
    parent_uuid = "GPU-00000000-0000-0000-0000-000000000000"
    instances = [
        gpu(
            1000 + n,
            name="NVIDIA A100-SXM4-80GB MIG 3g.40gb",
            uuid=f"MIG-{n}",
            mig=MigInstance(
                parent_index=0, parent_uuid=parent_uuid, profile="3g.40gb", gpu_instance_id=n
            ),
        )
        for n in (1, 2)
    ]
    empty = gpu(1, name="NVIDIA A100-SXM4-80GB", unusable="MIG mode with no instances carved")
    inv = inventory(nvidia_driver="550.54.15", cuda_version="12.4", gpus=[*instances, empty])
    findings = diagnose(facts_for(inv))
    mig = by_check(findings, "mig")
    assert [f.severity for f in mig] == [Severity.WARN, Severity.INFO]
    assert mig[0].message.startswith("GPU 1 is in MIG mode with no instances carved")
    assert "nvidia-smi mig -i 1 -cgi" in mig[0].fix
    assert mig[1].message == "GPU 0 is in MIG mode with 2 instance(s): 3g.40gb, 3g.40gb"


def test_gpu_held_by_a_stranger_warns_but_llmgw_engines_do_not() -> None:
    inv = inventory(
        nvidia_driver="550.54.15",
        cuda_version="12.4",
        gpus=[
            gpu(
                0,
                name="NVIDIA L40S",
                processes=[
                    GpuProcess(pid=4242, name="python3", used_memory_mb=30000),
                    GpuProcess(pid=777, name="llama-server", used_memory_mb=9000),
                ],
            )
        ],
    )
    findings = diagnose(facts_for(inv, engine_pids=[777]))
    held = by_check(findings, "gpu-processes")
    assert len(held) == 1
    assert held[0].severity == Severity.WARN
    assert "pid 4242 (python3, 30000 MiB)" in held[0].message
    assert "777" not in held[0].message


def test_nvidia_smi_failing_with_a_driver_present_fails_with_the_reboot_fix() -> None:
    inv = inventory(problems=["nvidia-smi -q -x exited 18: Failed to initialize NVML"])
    probe = CommandProbe(
        command="nvidia-smi -L",
        found=True,
        exit_code=18,
        output="Failed to initialize NVML: Driver/library version mismatch\n"
        "NVML library version: 550.90",
    )
    facts = facts_for(inv, nvidia_smi=probe, nvidia_driver_loaded=True, kernel_modules=["nvidia"])
    findings = diagnose(facts)
    assert (findings[0].severity, findings[0].check) == (Severity.FAIL, "nvidia-smi")
    assert "exited 18" in findings[0].message
    assert "reboot" in findings[0].fix
    # Discovery's own words about the same failure are not repeated.
    assert not by_check(findings, "discovery")
    assert not by_check(findings, "gpus")  # a broken GPU node is not a CPU node


def test_old_driver_warns_for_gpu_engines() -> None:
    inv = inventory(nvidia_driver="470.256.02", cuda_version="11.4", gpus=[gpu(0)])
    findings = diagnose(facts_for(inv))
    # No engine installed yet: each CUDA engine is judged at its oldest builds.
    cuda = by_check(findings, "cuda-version")
    assert [f.message.split(" needs")[0] for f in cuda] == ["SGLang", "TensorRT-LLM", "vLLM"]
    assert all(f.severity == Severity.WARN for f in cuda)
    assert "needs a driver for CUDA 12 or newer; driver 470.256.02 supports CUDA 11.4" in (
        cuda[2].message
    )
    assert "525 or newer" in cuda[2].fix


def test_the_cuda_an_installed_engine_needs_follows_its_version() -> None:
    inv = inventory(nvidia_driver="550.54.15", cuda_version="12.4", gpus=[gpu(0)])
    # vLLM 0.20.0 and later pin a PyTorch built on CUDA 13: a 12.4 driver cannot run them.
    new = diagnose(facts_for(inv, engines=[EngineCheck(engine="vllm", version="0.32.0")]))
    (cuda,) = by_check(new, "cuda-version")
    assert cuda.message == (
        "vLLM 0.32.0 needs a driver for CUDA 13 or newer; driver 550.54.15 supports CUDA 12.4"
    )
    assert "580 or newer" in cuda.fix
    assert "a vLLM version before 0.20.0" in cuda.fix
    old = diagnose(facts_for(inv, engines=[EngineCheck(engine="vllm", version="0.19.1")]))
    assert not by_check(old, "cuda-version")


# --- multi-node NVLink ---------------------------------------------------------------------


def test_gb200_tray_without_imex_channel_fails() -> None:
    inv = gb200_tray(ImexInfo(installed=True, running=True, channels=[]))
    findings = diagnose(facts_for(inv))
    assert (findings[0].severity, findings[0].check) == (Severity.FAIL, "imex-channel")
    assert "mknod /dev/nvidia-caps-imex-channels/channel0" in findings[0].fix
    joined = by_check(findings, "nvlink-fabric")[0]
    assert joined.severity == Severity.OK
    assert f"{NVL72_UUID}/32766" in joined.message


@pytest.mark.parametrize(
    ("imex", "words"),
    [
        (None, "nvidia-imex is not installed"),
        (ImexInfo(installed=False), "nvidia-imex is not installed"),
        (ImexInfo(installed=True, running=False, detail="inactive"), "not running (inactive)"),
    ],
)
def test_gb200_tray_without_running_imex_fails(imex: ImexInfo | None, words: str) -> None:
    findings = diagnose(facts_for(gb200_tray(imex)))
    first = findings[0]
    assert (first.severity, first.check) == (Severity.FAIL, "imex")
    assert words in first.message
    assert "systemctl enable --now nvidia-imex" in first.fix


def test_gb200_tray_healthy_gets_an_nvlink_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = facts_for(gb200_tray(ImexInfo(installed=True, running=True, channels=[0])))
    assert Severity.FAIL not in severities(diagnose(facts))
    code, out = run_doctor(monkeypatch, capsys, facts)
    assert code == 0
    assert "NCCL environment for a shard over nvlink:" in out
    assert "NCCL_MNNVL_ENABLE=1" in out
    assert "avx2" not in out  # an arm64 tray


def test_gb200_degraded_bandwidth_warns_and_not_joined_fails() -> None:
    imex = ImexInfo(installed=True, running=True, channels=[0])
    degraded = diagnose(facts_for(gb200_tray(imex, bandwidth="Degraded")))
    warn = by_check(degraded, "nvlink-bandwidth")[0]
    assert warn.severity == Severity.WARN
    assert warn.message.startswith("GPUs 0, 1, 2, 3 joined the NVLink fabric with Degraded")

    inv = gb200_tray(imex)
    inv.gpus[2].fabric = GpuFabric(
        state="Completed", status="Insufficient Resources", cluster_uuid=NVL72_UUID
    )
    broken = diagnose(facts_for(inv))
    assert (broken[0].severity, broken[0].check) == (Severity.FAIL, "nvlink-fabric")
    assert broken[0].message.startswith("GPU 2 is not in the NVLink fabric")
    assert "Insufficient Resources" in broken[0].message
    assert "NMX" in broken[0].fix  # a tray's fabric is managed from the switch trays


# --- order and JSON ------------------------------------------------------------------------


def test_findings_are_most_serious_first() -> None:
    inv = inventory(
        cpu_flags=["fma"],
        nvidia_driver="550.54.15",
        cuda_version="12.4",
        gpus=[gpu(0, ecc_uncorrected=3), gpu(1)],
        network_ports=[ib_port("mlx5_0"), ib_port("mlx5_1", state="DOWN")],
    )
    findings = diagnose(
        facts_for(inv, memlock=MemlockLimit(soft_bytes=8 << 20, hard_bytes=8 << 20))
    )
    order = {Severity.FAIL: 0, Severity.WARN: 1, Severity.INFO: 2, Severity.OK: 3}
    ranks = [order[f.severity] for f in findings]
    assert ranks == sorted(ranks)
    assert {f.severity for f in findings} == set(Severity)
    # Within one severity the order a node is brought up in: GPUs before host limits.
    fails = [f.check for f in findings if f.severity == Severity.FAIL]
    assert fails == ["gpu-ecc", "memlock"]


def test_json_carries_every_fact_and_round_trips(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = facts_for(
        h100_sxm_x8(fabric_state="In Progress", status="N/A"),
        fabric_manager="failed",
        persistence_mode={0: True, 1: False},
    )
    code, out = run_doctor(monkeypatch, capsys, facts, "--json")
    assert code == 1
    document = json.loads(out)
    assert set(document) == {"facts", "findings", "nccl_env"}
    assert DoctorFacts.model_validate(document["facts"]) == facts
    assert document["facts"]["inventory"]["name"] == "node-a"
    assert len(document["facts"]["inventory"]["gpus"]) == 8
    assert document["facts"]["fabric_manager"] == "failed"
    findings = [Finding.model_validate(f) for f in document["findings"]]
    assert findings == diagnose(facts)
    assert findings[0].check == "fabric-manager"
    assert document["nccl_env"]["infiniband"]["NCCL_IB_HCA"].startswith("=mlx5_0:1,")
    # Persistence mode off on GPU 1 is mentioned, not failed.
    persistence = [f for f in findings if f.check == "persistence-mode"]
    assert persistence[0].severity == Severity.INFO
    assert "GPU 1" in persistence[0].message
