"""RDMA ports from recorded sysfs trees, the management interface, and IMEX."""

from pathlib import Path

from activities.agent.fabric_parsing import (
    interface_for_address,
    is_ipv4_mapped,
    parse_ip_addr,
    parse_port_state,
    parse_rate_gbps,
    read_rdma_ports,
    roce_v2_ipv4_gid_index,
)
from activities.agent.imex import discover_imex, imex_channels, imex_running

MACHINES = Path(__file__).resolve().parent.parent / "fixtures" / "machines"


def test_roce_node_finds_the_v2_ipv4_gid_at_index_3() -> None:
    ports = read_rdma_ports(MACHINES / "roce_node" / "sys" / "class" / "infiniband")
    assert [(p.device, p.port) for p in ports] == [("mlx5_0", 1), ("mlx5_1", 1)]
    for port in ports:
        assert port.kind == "roce"
        assert port.active
        assert port.phys_state == "LinkUp"
        assert port.rate_gbps == 100.0
        assert port.roce_v2_gid_index == 3
    assert [p.netdev for p in ports] == ["ens1f0np0", "ens1f1np1"]
    assert ports[1].counters["symbol_error"] == 3


def test_ib_node_has_ndr_ports_and_no_gid_index() -> None:
    ports = read_rdma_ports(MACHINES / "ib_node" / "sys" / "class" / "infiniband")
    assert len(ports) == 4
    assert {p.kind for p in ports} == {"infiniband"}
    assert all(p.roce_v2_gid_index is None for p in ports)
    assert [p.rate_gbps for p in ports[:3]] == [400.0, 400.0, 400.0]
    down = ports[3]
    assert not down.active
    assert (down.state, down.phys_state) == ("DOWN", "Disabled")
    assert down.counters["link_downed"] == 1
    # The counters an operator reads first are always there.
    assert {"symbol_error", "port_rcv_errors", "excessive_buffer_overrun_errors"} <= set(
        down.counters
    )


def test_machine_without_rdma_has_no_ports(tmp_path: Path) -> None:
    assert read_rdma_ports(tmp_path / "missing") == []


def test_sysfs_value_formats() -> None:
    assert parse_port_state("4: ACTIVE") == "ACTIVE"
    assert parse_port_state("5: LinkUp") == "LinkUp"
    assert parse_rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5
    assert is_ipv4_mapped("0000:0000:0000:0000:0000:ffff:0a00:0001")
    assert not is_ipv4_mapped("fe80:0000:0000:0000:0e42:a1ff:fe5d:3b10")


def test_only_a_roce_v2_entry_with_ipv4_counts() -> None:
    mapped = "0000:0000:0000:0000:0000:ffff:0a00:0001"
    link_local = "fe80:0000:0000:0000:0e42:a1ff:fe5d:3b10"
    assert (
        roce_v2_ipv4_gid_index(
            {0: (link_local, "IB/RoCE v1"), 1: (link_local, "RoCE v2"), 2: (mapped, "IB/RoCE v1")}
        )
        is None
    )
    assert roce_v2_ipv4_gid_index({5: (mapped, "RoCE v2"), 3: (mapped, "RoCE v2")}) == 3


def test_management_interface_holds_the_node_address() -> None:
    roce = (MACHINES / "roce_node" / "ip_o_4_addr.txt").read_text()
    assert interface_for_address(roce, "10.10.1.15") == "eno1"
    assert interface_for_address(roce, "10.0.1.15") == "ens1f1np1"
    assert interface_for_address(roce, "203.0.113.9") == ""
    ib = (MACHINES / "ib_node" / "ip_o_4_addr.txt").read_text()
    assert interface_for_address(ib, "192.168.40.21") == "eno1np0"
    vm = (MACHINES / "cpu_no_avx2" / "ip_o_4_addr.txt").read_text()
    assert parse_ip_addr(vm) == [("lo", "127.0.0.1"), ("ens3", "10.20.0.7")]


def test_gb200_tray_runs_imex_with_channel_0() -> None:
    root = MACHINES / "gb200_nvl72_tray"
    assert imex_running(root / "proc")
    assert imex_channels(root / "dev" / "nvidia-caps-imex-channels") == [0]
    imex = discover_imex(
        proc_root=root / "proc",
        channels_dir=root / "dev" / "nvidia-caps-imex-channels",
        which=lambda name: f"/usr/bin/{name}",
    )
    assert imex is not None
    assert (imex.installed, imex.running, imex.channels) == (True, True, [0])


def test_imex_installed_but_stopped_says_so(tmp_path: Path) -> None:
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "comm").write_text("systemd\n")
    imex = discover_imex(
        proc_root=tmp_path / "proc",
        channels_dir=tmp_path / "none",
        which=lambda name: f"/usr/bin/{name}",
    )
    assert imex is not None
    assert imex.installed
    assert not imex.running
    assert "not running" in imex.detail
    assert "no IMEX channel" in imex.detail


def test_machine_without_imex_reports_none(tmp_path: Path) -> None:
    assert (
        discover_imex(
            proc_root=tmp_path,
            channels_dir=tmp_path / "none",
            which=lambda _: None,
            fallback_paths=(),
        )
        is None
    )
