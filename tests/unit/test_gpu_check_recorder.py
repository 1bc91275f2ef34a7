"""The GPU check's fixture recorder (bench/gpu_check/recorder.py), round trip: a machine is
recorded, the recording is loaded with the machine tests' own loader
(test_doctor_on_fixtures.discovered) and with the check's (fixture_loader.discover_fixture),
and both give the discovery of the machine recorded.

The "machines" recorded are the reconstructed fixtures: their fake tools first on PATH, their
trees as /proc, /etc, /sys and /dev. What is recorded of a real machine goes the same way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import tests.unit.test_doctor_on_fixtures as on_fixtures
from activities.agent.nvml_source import CommandResult, run_command
from bench.gpu_check.fixture_loader import discover_fixture, fixture_paths, tool_scripts
from bench.gpu_check.recorder import (
    DISCOVERY_FILE,
    MachineSources,
    anonymous_machine_id,
    fixture_view,
    read_expected,
    read_meta,
    record_machine,
    steady_view,
    write_expected,
)
from tests.machine_tools import MACHINES
from workflows.contracts import NodeInventory

# name, the address its tests give it, the architecture it has, whether nvidia-imex runs there
RECORDED = [
    ("h100_sxm_x8", "10.0.0.6", "x86_64", False),
    ("a100_80g_mig_3g40gb", "10.0.0.9", "x86_64", False),
    ("gb200_nvl72_tray", "10.1.0.21", "aarch64", True),
    ("roce_node", "10.10.1.15", "x86_64", False),
    ("ib_node", "10.10.2.3", "x86_64", False),
    ("cpu_no_avx2", "10.20.0.7", "x86_64", False),
]


def record(
    name: str,
    address: str,
    arch: str,
    imex: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[NodeInventory, Path]:
    """The recorded fixture `name` discovered as its tests discover it, and recorded from its
    tools (found only among its fakes) and its trees into tmp_path/machines/<name>."""
    (tmp_path / "source").mkdir(parents=True)
    inventory = on_fixtures.discovered(
        name, address, tmp_path / "source", monkeypatch, arch=arch, imex=imex
    )
    fakes = str(tmp_path / "source" / "bin")
    sources = MachineSources(
        paths=fixture_paths(MACHINES / name),
        which=lambda tool: shutil.which(tool, path=fakes),
        run=run_command,
    )
    dest = record_machine(tmp_path / "machines" / name, inventory, sources)
    return inventory, dest


@pytest.mark.parametrize(("name", "address", "arch", "imex"), RECORDED)
def test_a_recorded_machine_loads_back_to_the_same_discovery(
    name: str,
    address: str,
    arch: str,
    imex: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live, dest = record(name, address, arch, imex, tmp_path, monkeypatch)
    expected = fixture_view(
        live.model_copy(update={"machine_id": anonymous_machine_id(live.machine_id)})
    )

    # The machine tests' loader, pointed at the recordings instead of the fixtures.
    monkeypatch.setattr(on_fixtures, "MACHINES", dest.parent)
    (tmp_path / "loaded").mkdir()
    loaded = on_fixtures.discovered(
        name, address, tmp_path / "loaded", monkeypatch, arch=arch, imex=imex
    )
    assert fixture_view(loaded) == expected
    # The check's own loader, from what recorded.json says of the recording.
    assert fixture_view(discover_fixture(dest, name)) == expected
    # Not a vacuous comparison: the machine's facts are there.
    assert expected["cpu_model"] or expected["gpus"] or expected["network_ports"]


def test_what_each_machine_holds_is_recorded_at_the_fixtures_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _live, gb200 = record(
        "gb200_nvl72_tray", "10.1.0.21", "aarch64", True, tmp_path / "a", monkeypatch
    )
    source = MACHINES / "gb200_nvl72_tray"
    for file in ("nvidia_smi_q_x.xml", "nvidia_smi_L.txt", "nvidia_smi_topo_m.txt"):
        assert (gb200 / file).read_text() == (source / file).read_text()
    # Of /proc only the nvidia-imex process (all discovery looks for), and the IMEX channel.
    imex_pids = [
        p.parent.name
        for p in (source / "proc").glob("*/comm")
        if p.read_text().strip() == "nvidia-imex"
    ]
    assert sorted(p.parent.name for p in (gb200 / "proc").glob("*/comm")) == imex_pids
    assert (gb200 / "dev/nvidia-caps-imex-channels/channel0").is_file()
    meta = read_meta(gb200)
    assert meta["address"] == "10.1.0.21"
    assert meta["nvidia_imex_installed"] is True

    _live, roce = record("roce_node", "10.10.1.15", "x86_64", False, tmp_path / "b", monkeypatch)
    port = "sys/class/infiniband/mlx5_0/ports/1"
    for file in ("link_layer", "state", "rate", "gids/3", "gid_attrs/types/3", "gid_attrs/ndevs/3"):
        assert (roce / port / file).read_text() == (
            MACHINES / "roce_node" / port / file
        ).read_text()
    assert (roce / "sys/class/infiniband/mlx5_0/device/net/ens1f0np0/ifindex").is_file()


def test_the_machine_id_is_replaced_by_a_digest_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live, dest = record("cpu_no_avx2", "10.20.0.7", "x86_64", False, tmp_path, monkeypatch)
    recorded = (dest / "etc/machine-id").read_text().strip()
    assert live.machine_id == "3f9a0c6e2b7d41c58e1f04a7d92b6c31"
    assert recorded == anonymous_machine_id(live.machine_id) != live.machine_id
    assert len(recorded) == 32
    assert int(recorded, 16) >= 0
    every_file = "".join(p.read_text() for p in dest.rglob("*") if p.is_file())
    assert live.machine_id not in every_file
    assert anonymous_machine_id("") == ""


def test_a_failing_tool_is_listed_not_recorded_except_an_answer_on_stdout(tmp_path: Path) -> None:
    """nvidia-smi failing (driver not loaded) leaves no file the loader would replay as a
    success; systemctl is-active answers `inactive` with exit 3, which is its answer."""
    answers = {
        "nvidia-smi": CommandResult(9, "", "NVIDIA-SMI has failed because it couldn't communicate"),
        "ip": CommandResult(0, "2: eno1    inet 10.0.0.5/24 scope global eno1\n"),
        "systemctl": CommandResult(3, "inactive\n"),
    }
    sources = MachineSources(
        paths=fixture_paths(MACHINES / "cpu_no_avx2"),
        which=lambda tool: f"/usr/bin/{tool}",
        run=lambda argv: answers[Path(argv[0]).name],
    )
    dest = record_machine(tmp_path / "m", NodeInventory(name="m", address="10.0.0.5"), sources)
    assert not list(dest.glob("nvidia_smi*"))
    assert (dest / "ip_o_4_addr.txt").read_text().startswith("2: eno1")
    assert (dest / "systemctl_is_active_nvidia_fabricmanager.txt").read_text() == "inactive\n"
    commands = {c["command"]: c for c in read_meta(dest)["commands"]}
    failed = commands["nvidia-smi -q -x"]
    assert (failed["exit_code"], failed["file"]) == (9, None)
    assert "couldn't communicate" in failed["stderr"]
    # The check's loader offers only the tools the recording answers for.
    assert set(tool_scripts(dest, imex=False)) == {"ip", "systemctl"}


def test_a_gpus_pci_numa_node_is_recorded_where_discovery_would_read_it(tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(MACHINES / "cpu_no_avx2", source)
    (source / "sys/bus/pci/devices/0000:18:00.0").mkdir(parents=True)
    (source / "sys/bus/pci/devices/0000:18:00.0/numa_node").write_text("1\n")
    inventory = NodeInventory.model_validate(
        {
            "name": "m",
            "address": "10.0.0.5",
            "gpus": [
                {
                    "index": 0,
                    "uuid": "GPU-1",
                    "name": "NVIDIA H100",
                    "pci_bus_id": "00000000:18:00.0",
                    "gpu_class": "h100-80g",
                    "memory_mb": 81559,
                }
            ],
        }
    )
    sources = MachineSources(paths=fixture_paths(source), which=lambda _tool: None)
    dest = record_machine(tmp_path / "m", inventory, sources)
    assert (dest / "sys/bus/pci/devices/0000:18:00.0/numa_node").read_text() == "1\n"


def test_a_recording_never_overwrites_another(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    sources = MachineSources(
        paths=fixture_paths(MACHINES / "cpu_no_avx2"), which=lambda _tool: None
    )
    with pytest.raises(FileExistsError, match="choose another --name"):
        record_machine(tmp_path / "m", NodeInventory(name="m", address="10.0.0.5"), sources)


def test_discovery_json_is_the_inventory_without_what_the_host_adds(tmp_path: Path) -> None:
    inventory = NodeInventory(
        name="m", address="10.0.0.5", hostname="gpu-7", kernel="6.8", cpu_cores=16
    )
    write_expected(tmp_path, inventory)
    written = json.loads((tmp_path / DISCOVERY_FILE).read_text())
    assert written == read_expected(tmp_path)
    assert written["address"] == "10.0.0.5"
    assert not {"name", "hostname", "kernel", "cpu_cores", "arch"} & set(written)


def test_the_steady_view_leaves_out_what_moves_between_two_readings() -> None:
    def node(used: int, pid: int, symbol_errors: int) -> NodeInventory:
        return NodeInventory.model_validate(
            {
                "name": "m",
                "address": "10.0.0.5",
                "gpus": [
                    {
                        "index": 0,
                        "uuid": "GPU-1",
                        "name": "NVIDIA H100 80GB HBM3",
                        "gpu_class": "h100-80g",
                        "memory_mb": 81559,
                        "memory_used_mb": used,
                        "processes": [{"pid": pid, "used_memory_mb": used}],
                    }
                ],
                "network_ports": [
                    {"device": "mlx5_0", "counters": {"symbol_error": symbol_errors}}
                ],
            }
        )

    assert steady_view(node(512, 4242, 0)) == steady_view(node(70000, 5151, 3))
    assert fixture_view(node(512, 4242, 0)) != fixture_view(node(70000, 5151, 3))
    changed_card = node(512, 4242, 0).model_copy(update={"gpus": []})
    assert steady_view(changed_card) != steady_view(node(512, 4242, 0))
