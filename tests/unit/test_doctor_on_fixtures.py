"""`llmgw doctor` on the recorded machines: the real discovery reads each fixture (a fake
`nvidia-smi` and `ip` answer from its recordings, MachinePaths point into its sysfs and proc
trees), and its inventory goes through the real checks and the real command's output.

test_doctor.py builds inventories by hand; this file proves that what discovery actually makes
of each machine leads the operator to the right finding and the right NCCL environment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from activities.agent.discovery import MachinePaths, discover_inventory
from activities.agent.doctor.checks import diagnose
from activities.agent.doctor.facts import CommandProbe, DoctorFacts, EngineCheck, MemlockLimit
from activities.agent.doctor.findings import Finding, Severity
from activities.agent.gpu_parsing import NvidiaSmiReport
from activities.agent.nvml_source import GpuToolMissing
from tests.machine_tools import MACHINES, by_check, recorded_nvidia_smi, run_doctor, write_tool
from tests.unit.doctor_machines import ALL_MODULES
from workflows.contracts import NodeInventory


class NoNvml:
    """NVML as on a machine without libnvidia-ml, whatever this test machine has."""

    def read(self) -> NvidiaSmiReport:
        raise GpuToolMissing("no NVML in this test")


def _fake_tools(bin_dir: Path, root: Path, imex: bool) -> None:
    """nvidia-smi and ip answering from the machine's recordings, where it has them."""
    if (root / "nvidia_smi_q_x.xml").exists():
        recorded_nvidia_smi(bin_dir, root)
    if (root / "ip_o_4_addr.txt").exists():
        write_tool(bin_dir / "ip", f'cat "{root}/ip_o_4_addr.txt"\n')
    else:
        write_tool(bin_dir / "ip", "exit 1\n")  # not the test machine's own interfaces
    if imex:
        write_tool(bin_dir / "nvidia-imex", "exit 0\n")


def discovered(
    name: str,
    address: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    arch: str = "x86_64",
    imex: bool = False,
) -> NodeInventory:
    """What the agent's discovery makes of the recorded machine `name`."""
    root = MACHINES / name
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tools(bin_dir, root, imex)
    # The fakes first; the system's directories only for `cat` and `sh`.
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    # The architecture is the test machine's otherwise, and the AVX2 check depends on it.
    monkeypatch.setattr("platform.machine", lambda: arch)
    paths = MachinePaths(
        proc=root / "proc",
        etc=root / "etc",
        infiniband=root / "sys/class/infiniband",
        pci_devices=root / "sys/bus/pci/devices",
        imex_channels=root / "dev/nvidia-caps-imex-channels",
    )
    return discover_inventory(name, address, paths=paths, nvml=NoNvml())


def facts_for(inv: NodeInventory, **fields: object) -> DoctorFacts:
    """The doctor's own facts of a well-kept node around the discovered inventory."""
    gpu_node = bool(inv.gpus)
    base: dict[str, object] = {
        "inventory": inv,
        "kernel_modules": ALL_MODULES,
        "nvidia_driver_loaded": gpu_node,
        "nvidia_smi": CommandProbe(
            command="nvidia-smi -L", found=gpu_node, exit_code=0 if gpu_node else None
        ),
        "memlock": MemlockLimit(source="llmgw agent pid 4242"),
        "fabric_manager": "active",
        "engines": [
            EngineCheck(
                engine="llamacpp",
                version="11434.0.0",
                path="/var/lib/llmgw/engines/llamacpp/11434.0.0/llama-server",
                runnable=True,
                detail="version: 11434 (abc1234)",
            )
        ],
        "state_dir": "/var/lib/llmgw",
    }
    base.update(fields)
    return DoctorFacts.model_validate(base)


def of(findings: list[Finding], severity: Severity) -> list[Finding]:
    return [f for f in findings if f.severity == severity]


def test_h100_hgx_with_fabric_manager_inactive_fails_first_about_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = discovered("h100_sxm_x8", "10.0.0.6", tmp_path, monkeypatch)
    assert inv.nvswitch
    assert len(inv.gpus) == 8
    assert inv.problems == []
    facts = facts_for(inv, fabric_manager="inactive")
    findings = diagnose(facts)

    first = findings[0]
    assert (first.severity, first.check) == (Severity.FAIL, "fabric-manager")
    assert "nvidia-fabricmanager is inactive" in first.message
    assert "CUDA cannot start" in first.message
    assert "sudo systemctl enable --now nvidia-fabricmanager" in first.fix
    assert "550.54.15" in first.fix  # the fabric manager's version must equal the driver's
    # The only failure: the GPUs' zero cluster UUID is a single machine, no domain to join.
    assert of(findings, Severity.FAIL) == [first]
    assert not by_check(findings, "imex")

    code, out = run_doctor(monkeypatch, capsys, facts)
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("node h100_sxm_x8 (10.0.0.6): 8 x NVIDIA H100 80GB HBM3")
    assert "driver 550.54.15, CUDA 12.4" in lines[0]
    assert "NVSwitch" in lines[0]
    assert lines[2].startswith("FAIL  fabric-manager: NVSwitch present but nvidia-fabricmanager")
    assert lines[3].strip().startswith("fix: `sudo systemctl enable --now nvidia-fabricmanager`")


def test_h100_hgx_with_the_fabric_manager_running_has_no_failure_and_names_the_busy_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = discovered("h100_sxm_x8", "10.0.0.6", tmp_path, monkeypatch)
    findings = diagnose(facts_for(inv))
    assert not of(findings, Severity.FAIL)
    assert by_check(findings, "fabric-manager")[0].severity == Severity.OK
    # The recording has one GPU held by a process llmgw did not start.
    (held,) = by_check(findings, "gpu-processes")
    assert held.severity == Severity.WARN
    assert "is held by processes llmgw did not start" in held.message
    busy = [g.index for g in inv.gpus if g.processes]
    assert held.message.startswith(f"GPU {busy[0]} ")


def test_ecc_uncorrected_fails_naming_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = discovered("ecc_uncorrected", "10.0.0.8", tmp_path, monkeypatch)
    bad = [g for g in inv.gpus if g.ecc_uncorrected]
    assert [g.index for g in bad] == [1]
    findings = diagnose(facts_for(inv))

    first = findings[0]
    assert (first.severity, first.check) == (Severity.FAIL, "gpu-ecc")
    assert first.message.startswith(f"GPU 1 ({bad[0].uuid}) has 3 uncorrected ECC errors")
    assert "placement leaves it out" in first.message
    assert "nvidia-smi -r -i 1" in first.fix
    assert len(by_check(findings, "gpu-ecc")) == 1  # GPU 0 is fine
    assert not by_check(findings, "gpu-unusable")  # said once, as ECC

    code, out = run_doctor(monkeypatch, capsys, facts_for(inv))
    assert code == 1
    assert out.splitlines()[2].startswith("FAIL  gpu-ecc: GPU 1 (")


def test_roce_node_finds_the_v2_gid_and_gives_nccl_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = discovered("roce_node", "10.10.1.15", tmp_path, monkeypatch)
    assert inv.management_interface == "eno1"
    findings = diagnose(facts_for(inv))

    gid = by_check(findings, "roce-gid")
    assert [f.severity for f in gid] == [Severity.OK, Severity.OK]
    assert "RoCE port mlx5_0/1 (RoCE, ens1f0np0) uses GID index 3 (RoCE v2, IPv4)" in [
        f.message for f in gid
    ]
    assert not of(findings, Severity.FAIL)
    # mlx5_1's recording counts symbol errors: a dirty link, named by port and counter.
    (dirty,) = by_check(findings, "rdma-counters")
    assert dirty.severity == Severity.WARN
    assert dirty.message == "port mlx5_1/1 (RoCE, ens1f1np1) counts errors: symbol_error=3"

    code, out = run_doctor(monkeypatch, capsys, facts_for(inv))
    assert code == 0
    assert "2 RoCE port(s)" in out.splitlines()[0]
    roce_env = out.split("NCCL environment for a shard over roce:\n", 1)[1]
    roce_lines = roce_env.split("NCCL environment", 1)[0].splitlines()
    assert "  NCCL_IB_GID_INDEX=3" in roce_lines
    assert "  NCCL_IB_HCA==mlx5_0:1,mlx5_1:1" in roce_lines
    assert "  NCCL_SOCKET_IFNAME==eno1" in roce_lines
    assert "  GLOO_SOCKET_IFNAME=eno1" in roce_lines

    code, out = run_doctor(monkeypatch, capsys, facts_for(inv), "--json")
    assert code == 0
    document = json.loads(out)
    assert document["nccl_env"]["roce"]["NCCL_IB_GID_INDEX"] == "3"
    assert [p["roce_v2_gid_index"] for p in document["facts"]["inventory"]["network_ports"]] == [
        3,
        3,
    ]


def test_cpu_without_avx2_warns_and_otherwise_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = discovered("cpu_no_avx2", "10.20.0.7", tmp_path, monkeypatch)
    assert inv.gpus == []
    assert inv.management_interface == "ens3"
    findings = diagnose(facts_for(inv))

    (avx2,) = by_check(findings, "avx2")
    assert avx2.severity == Severity.WARN
    assert "QEMU Virtual CPU version 2.5+" in avx2.message
    assert "reports no AVX2" in avx2.message
    assert "host-passthrough" in avx2.fix
    assert of(findings, Severity.WARN) == [avx2]
    assert not of(findings, Severity.FAIL)
    assert by_check(findings, "gpus")[0].message.startswith("CPU node: no NVIDIA GPU")

    code, out = run_doctor(monkeypatch, capsys, facts_for(inv))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("node cpu_no_avx2 (10.20.0.7): no NVIDIA GPU")
    assert lines[2].startswith("WARN  avx2: the CPU (QEMU Virtual CPU version 2.5+)")
    assert "0 fail, 1 warn" in out
    assert "NCCL environment for a shard over socket:" in out
    assert "  NCCL_IB_DISABLE=1" in out


def test_gb200_tray_warns_of_degraded_nvlink_bandwidth_on_gpu_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = discovered(
        "gb200_nvl72_tray", "10.1.0.21", tmp_path, monkeypatch, arch="aarch64", imex=True
    )
    assert inv.imex is not None
    assert inv.imex.running
    assert inv.imex.channels == [0]
    findings = diagnose(facts_for(inv))

    (degraded,) = by_check(findings, "nvlink-bandwidth")
    assert degraded.severity == Severity.WARN
    assert degraded.message.startswith("GPU 3 joined the NVLink fabric with Degraded bandwidth")
    assert "nvidia-smi nvlink -s" in degraded.fix
    assert not of(findings, Severity.FAIL)
    # IMEX runs with its channel: a model may span the domain's nodes.
    assert [f.severity for f in by_check(findings, "imex")] == [Severity.OK]

    code, out = run_doctor(monkeypatch, capsys, facts_for(inv))
    assert code == 0
    assert "WARN  nvlink-bandwidth: GPU 3 joined the NVLink fabric with Degraded" in out
    # The other three GPUs joined fully; the node offers the NVLink fabric to a shard.
    assert "NCCL environment for a shard over nvlink:" in out
    assert "  NCCL_MNNVL_ENABLE=1" in out
