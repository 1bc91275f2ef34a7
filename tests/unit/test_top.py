"""`llmgw top` without a terminal: the figures it works out and the lines it draws, from
hand-made readings."""

import curses
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from workers.node_telemetry import EngineFigures, GpuFigures, NodeTelemetry
from workers.top.data import (
    GpuRow,
    KeyQuota,
    ModelCounters,
    NodeRow,
    ReplicaRow,
    TopData,
    WaitingRow,
    cluster_rows,
    counters_from_samples,
    key_quotas,
    model_rates,
    queue_from_samples,
)
from workers.top.keys import QUIT, REFRESH, UiState, handle_key
from workers.top.render import Screen, render
from workflows.contracts import (
    GpuInfo,
    LedgerState,
    NodeInventory,
    NodeRecord,
    NodeState,
    ReplicaState,
    Route,
)

GIB = 1024**3
ROOT = Path(__file__).resolve().parents[2]


def gpu(index: int, util: float, used_gib: float, temp: float, power: float) -> GpuRow:
    return GpuRow(
        index=index,
        name="H100",
        utilization_pct=util,
        memory_used=used_gib * GIB,
        memory_total=80 * GIB,
        temperature_c=temp,
        power_w=power,
        power_limit_w=700,
    )


def sample_data(taken_at: float = 10.0, requests: float = 100.0) -> TopData:
    return TopData(
        taken_at=taken_at,
        nodes=[
            NodeRow(name="b-node", state="ready", gpus=[gpu(0, 90, 70, 80, 600)]),
            NodeRow(
                name="a-node",
                state="ready",
                cordoned=True,
                gpus=[gpu(0, 10, 10, 40, 100), gpu(1, 30, 30, 50, 200)],
            ),
            NodeRow(name="c-node", state="unreachable", telemetry_problem="ConnectError"),
        ],
        replicas=[
            ReplicaRow(replica_id="m-1", model="m", state="ready", node="a-node", running=1),
            ReplicaRow(replica_id="m-0", model="m", state="ready", node="b-node", running=9),
        ],
        models=[
            ModelCounters(
                model="m", requests=requests, tokens=10 * requests, routed=requests, errors=0
            )
        ],
        keys=[
            KeyQuota(name="small", tokens_today=10, budget_spent=10, token_budget=1000),
            KeyQuota(name="big", tokens_today=900, budget_spent=900, token_budget=1000, rpm=60),
            KeyQuota(name="free", tokens_today=5),
        ],
        in_flight=4,
    )


def lines_of(
    ui: UiState, data: TopData | None = None, width: int = 110, height: int = 24
) -> list[str]:
    screen = Screen(data or sample_data(), [], refreshed="12:00:01")
    return render(screen, ui, width, height)


def rows(lines: list[str], first_word: str) -> list[str]:
    # A selected row is marked "> " in the gutter: the rows come without it.
    unmarked = [line.removeprefix("> ") for line in lines]
    return [line for line in unmarked if line.split()[:1] == [first_word]]


def test_the_screen_is_exactly_the_terminals_size() -> None:
    for width, height in ((80, 24), (40, 5), (200, 60), (1, 1)):
        lines = lines_of(UiState(), width=width, height=height)
        assert len(lines) == height
        assert all(len(line) == width for line in lines)
    assert render(Screen(None, []), UiState(), 0, 10) == []
    assert lines_of(UiState())[-1].rstrip() == UiState().help
    assert UiState().help.startswith("q quit")
    assert "c cordon" in UiState().help


def test_nodes_show_their_gpus_now_summed_and_one_by_one() -> None:
    lines = lines_of(UiState())
    assert lines[0].startswith("llmgw top  3 nodes  3 GPUs  2/2 replicas ready")
    assert "4 in flight" in lines[0]
    (a_node,) = rows(lines, "a-node")
    # Mean utilisation, memory and power summed, the hottest card.
    assert a_node.split()[1:7] == ["ready,cordoned", "2", "20%", "40/160", "50C", "300/1400"]
    (c_node,) = rows(lines, "c-node")
    assert "?" in c_node.split()
    assert "ConnectError" in c_node
    # Under their node, behind the gutter where a selected node is marked.
    gpu_lines = [line for line in lines if line.startswith("    gpu ")]
    assert len(gpu_lines) == 3
    assert gpu_lines[0].split()[3:7] == ["10%", "10/80", "40C", "100/700"]


def node_order(ui: UiState) -> list[str]:
    # The selected node is marked "> " in the gutter.
    words = [line.removeprefix("> ").split() for line in lines_of(ui)]
    return [w[0] for w in words if w[:1] != [] and w[0].endswith("-node")]


def test_s_sorts_nodes_by_name_utilisation_then_memory() -> None:
    ui = UiState()
    assert node_order(ui) == ["a-node", "b-node", "c-node"]
    ui, _ = handle_key(ui, ord("s"))
    assert ui.sort_name == "util"
    assert node_order(ui) == ["b-node", "a-node", "c-node"]
    assert "sort: util" in lines_of(ui)[1]
    ui, _ = handle_key(ui, ord("s"))
    assert ui.sort_name == "memory"
    assert node_order(ui) == ["b-node", "a-node", "c-node"]


def test_keys_switch_panes_sort_scroll_refresh_and_quit() -> None:
    ui = UiState()
    ui, action = handle_key(ui, 9)  # tab
    assert (ui.pane_name, action) == ("Replicas", None)
    ui, _ = handle_key(ui, curses.KEY_RIGHT)
    assert ui.pane_name == "Traffic"
    for name in ("Models", "Mirror", "Nodes"):
        ui, _ = handle_key(ui, curses.KEY_RIGHT)
        assert ui.pane_name == name
    ui, _ = handle_key(ui, curses.KEY_LEFT)
    assert ui.pane_name == "Mirror"
    ui, _ = handle_key(ui, curses.KEY_LEFT)
    ui, _ = handle_key(ui, curses.KEY_LEFT)
    assert ui.pane_name == "Traffic"
    ui, _ = handle_key(ui, curses.KEY_DOWN)
    ui, _ = handle_key(ui, curses.KEY_DOWN)
    ui, _ = handle_key(ui, curses.KEY_UP)
    assert ui.scroll == 1
    assert handle_key(ui, ord("r")) == (ui, REFRESH)
    assert handle_key(ui, ord("q")) == (ui, QUIT)
    assert handle_key(ui, ord("x")) == (ui, None)


def test_replicas_sorted_by_load_show_the_busiest_first() -> None:
    ui = UiState(pane=1, sorts=(0, 3, 0))
    lines = lines_of(ui)
    assert "[Replicas]" in lines[1]
    assert "sort: load" in lines[1]
    order = [line.split()[0] for line in lines if line.startswith("m-")]
    assert order == ["m-0", "m-1"]


def test_scrolling_keeps_the_column_headings() -> None:
    many = TopData(
        taken_at=0,
        replicas=[
            ReplicaRow(replica_id=f"r-{i:02d}", model="m", state="ready", node="n")
            for i in range(40)
        ],
    )
    ui = UiState(pane=1, scroll=5)
    lines = lines_of(ui, many, height=10)
    assert lines[3].startswith("REPLICA")
    assert lines[4].startswith("r-05")
    # Scrolled past the end: the last rows fill the screen, not blank space.
    lines = lines_of(UiState(pane=1, scroll=1000), many, height=10)
    assert lines[-2].startswith("r-39")


def test_rates_need_two_readings_and_survive_a_gateway_restart() -> None:
    first = sample_data(taken_at=10.0, requests=100)
    (rate,) = model_rates(first, None)
    assert rate.requests_per_s is None
    second = sample_data(taken_at=12.0, requests=120)
    second.models[0].routed_to_cache = 15  # of the 20 choices since the last reading
    second.models[0].errors = 2
    (rate,) = model_rates(second, first)
    assert rate.requests_per_s == 10.0
    assert rate.tokens_per_s == 100.0
    assert rate.cache_share == 0.75
    assert rate.error_share == 0.1
    restarted = sample_data(taken_at=14.0, requests=6)
    (rate,) = model_rates(restarted, second)
    assert rate.requests_per_s == 3.0  # counted from zero again, not -57 per second


def test_traffic_shows_rates_cache_hits_and_the_keys_nearest_their_budget_first() -> None:
    first, second = sample_data(10.0, 100), sample_data(12.0, 120)
    second.models[0].routed_to_cache = 15
    screen = Screen(second, model_rates(second, first), refreshed="12:00:03")
    lines = render(screen, UiState(pane=2), 110, 24)
    assert "10.0 req/s" in lines[0]
    (model,) = rows(lines, "m")
    assert model.split() == ["m", "10.0", "100", "0%", "75%", "-", "-"]
    order = [
        line.split()[0] for line in lines if line.split()[:1] in (["big"], ["small"], ["free"])
    ]
    assert order == ["big", "small", "free"]
    (big,) = rows(lines, "big")
    assert "900/1000 90% per day" in big


def test_traffic_shows_the_routing_state_and_the_misrouted_share_since_last() -> None:
    first, second = sample_data(10.0, 100), sample_data(12.0, 120)
    first.models[0].states = {"exact": 90.0, "degraded": 10.0}
    first.models[0].predicted, first.models[0].incorrect = 50.0, 1.0
    # Of the 20 choices since: 2 exact, 18 degraded (the feed went down); of the 10 requests
    # predicted to find their prefix, 3 did not.
    second.models[0].states = {"exact": 92.0, "degraded": 28.0}
    second.models[0].predicted, second.models[0].incorrect = 60.0, 4.0
    (rate,) = model_rates(second, first)
    assert (rate.state, rate.state_share, rate.incorrect_share) == ("degraded", 0.9, 0.3)
    lines = render(Screen(second, [rate], refreshed="12:00:03"), UiState(pane=2), 110, 24)
    assert lines[3].split()[-2:] == ["ROUTING", "MISROUTED"]
    (model,) = rows(lines, "m")
    assert model.split()[-3:] == ["degraded", "90%", "30%"]


def test_what_could_not_be_read_is_said_on_the_third_line() -> None:
    data = sample_data()
    data.problems = ["gateway admin API at http://127.0.0.1:8001: ConnectError", "Temporal: x"]
    lines = lines_of(UiState(), data)
    assert lines[2].startswith("! gateway admin API at http://127.0.0.1:8001: ConnectError")
    assert "(+1 more)" in lines[2]


def test_the_gateways_counters_per_model() -> None:
    samples = [
        ("llmgw_requests_total", {"model": "m", "endpoint": "chat", "status": "200"}, 8.0),
        ("llmgw_requests_total", {"model": "m", "endpoint": "chat", "status": "429"}, 2.0),
        ("llmgw_tokens_total", {"model": "m", "kind": "prompt"}, 30.0),
        ("llmgw_tokens_total", {"model": "m", "kind": "completion"}, 12.0),
        ("llmgw_routing_decisions_total", {"model": "m", "reason": "kv_prefix"}, 3.0),
        ("llmgw_routing_decisions_total", {"model": "m", "reason": "prefix"}, 1.0),
        ("llmgw_routing_decisions_total", {"model": "m", "reason": "least_load"}, 4.0),
        ("llmgw_routing_state_total", {"model": "m", "state": "exact", "why": "kv_events"}, 3.0),
        ("llmgw_routing_state_total", {"model": "m", "state": "fallback", "why": "no_match"}, 4),
        ("llmgw_routing_state_total", {"model": "m", "state": "fallback", "why": "policy"}, 1),
        ("llmgw_routing_predicted_total", {"model": "m", "state": "exact"}, 3.0),
        ("llmgw_routing_incorrect_total", {"model": "m", "state": "exact"}, 1.0),
        ("llmgw_requests_created", {"model": "m"}, 1e9),  # not a counter's value
        ("llmgw_requests_in_flight", {}, 5.0),
    ]
    (model,), in_flight = counters_from_samples(samples)
    assert (model.requests, model.errors, model.tokens) == (10, 2, 42)
    assert (model.routed, model.routed_to_cache) == (8, 4)
    assert model.states == {"exact": 3, "fallback": 5}
    assert (model.predicted, model.incorrect) == (3, 1)
    assert in_flight == 5


def test_the_gateways_fair_queue_from_its_metrics() -> None:
    samples = [
        ("llmgw_queue_waiting", {"model": "m", "key": "flood", "priority": "batch"}, 12.0),
        ("llmgw_queue_waiting", {"model": "m", "key": "chat", "priority": "interactive"}, 1.0),
        ("llmgw_queue_waiting", {"model": "a", "key": "flood", "priority": "standard"}, 2.0),
        (
            "llmgw_queue_oldest_wait_seconds",
            {"model": "m", "key": "flood", "priority": "batch"},
            4.5,
        ),
        (
            "llmgw_queue_oldest_wait_seconds",
            {"model": "m", "key": "chat", "priority": "interactive"},
            0.2,
        ),
        ("llmgw_queue_refusals_total", {"model": "m", "reason": "queue_full"}, 3.0),
        ("llmgw_queue_refusals_total", {"model": "m", "reason": "queue_timeout"}, 1.0),
        ("llmgw_replica_depth", {"replica": "m-0"}, 2.0),
        ("llmgw_queue_admitted", {"model": "m"}, 2.0),
    ]
    waiting, depths = queue_from_samples(samples)
    # By model, then the highest class first.
    assert [(w.model, w.key, w.priority, w.waiting, w.oldest_s) for w in waiting] == [
        ("a", "flood", "standard", 2, None),
        ("m", "chat", "interactive", 1, 0.2),
        ("m", "flood", "batch", 12, 4.5),
    ]
    assert depths == {"m-0": 2}
    models, _ = counters_from_samples(samples)
    a, m = sorted(models, key=lambda c: c.model)
    assert m.queue_refused == {"queue_full": 3, "queue_timeout": 1}
    assert a.queue_refused == {}


def test_traffic_shows_who_waits_and_what_the_queue_refused_only_when_any() -> None:
    quiet = lines_of(UiState(pane=2))
    assert not any("fair queue" in line for line in quiet)
    assert "waiting" not in quiet[0]

    data = sample_data()
    data.waiting = [
        WaitingRow(model="m", key="chat", priority="interactive", waiting=1, oldest_s=0.25),
        WaitingRow(model="m", key="flood", priority="batch", waiting=12, oldest_s=4.5),
    ]
    data.models[0].queue_refused = {"queue_full": 3}
    lines = lines_of(UiState(pane=2), data, height=30)
    assert "4 in flight  13 waiting" in lines[0]
    title = lines.index(next(line for line in lines if "fair queue" in line))
    assert lines[title + 1].split() == ["MODEL", "KEY", "CLASS", "WAITING", "OLDEST"]
    assert lines[title + 2].split() == ["m", "chat", "interactive", "1", "0.2s"]
    assert lines[title + 3].split() == ["m", "flood", "batch", "12", "4.5s"]
    assert lines[title + 4].startswith("Refused since the gateway started: m: 3 queue full (429)")

    # Nothing waits now, but the queue refused some: the section says both.
    data.waiting = []
    lines = lines_of(UiState(pane=2), data, height=30)
    title = lines.index(next(line for line in lines if "fair queue" in line))
    assert lines[title + 1].startswith("nothing waits")


def test_replicas_show_the_depth_the_gateway_learnt() -> None:
    data = sample_data()
    data.replica_depths = {"m-0": 3}
    lines = lines_of(UiState(pane=1), data)
    header = next(line for line in lines if line.startswith("REPLICA"))
    assert header.split()[5:8] == ["RUNNING", "WAITING", "DEPTH"]
    (m0,) = rows(lines, "m-0")
    (m1,) = rows(lines, "m-1")
    # No engine named here: RUNNING, WAITING and DEPTH are the last three.
    assert m0.split()[-3:] == ["9", "-", "3"]
    assert m1.split()[-3:] == ["1", "-", "-"]


def test_quota_use_counts_the_budgets_own_period() -> None:
    today = date(2026, 12, 3)
    keys = [
        {"key_id": "k1", "name": "daily", "limits": {"token_budget": 1000, "rpm": 60}},
        {
            "key_id": "k2",
            "name": "monthly",
            "limits": {"token_budget": 5000, "budget_period": "month"},
        },
        {"key_id": "k3", "name": "gone", "limits": {}, "revoked_at": "2026-12-01T00:00:00"},
    ]

    def row(key: str, day: str, requests: int, tokens: int) -> dict[str, object]:
        return {
            "key_id": key,
            "model": "m",
            "day": day,
            "requests": requests,
            "prompt_tokens": tokens,
            "completion_tokens": 1,
        }

    usage = [
        row("k1", "2026-12-03", 3, 99),
        row("k1", "2026-12-02", 5, 499),
        row("k2", "2026-12-01", 1, 999),
        row("k2", "2026-12-03", 2, 9),
        row("k2", "2026-11-30", 9, 99999),  # last month: outside this month's budget
    ]
    daily, monthly = key_quotas(keys, usage, today)
    assert (daily.name, daily.requests_today, daily.tokens_today) == ("daily", 3, 100)
    assert (daily.budget_spent, daily.token_budget, daily.rpm) == (100, 1000, 60)
    assert (monthly.tokens_today, monthly.budget_spent, monthly.budget_period) == (
        10,
        1010,
        "month",
    )


def test_cluster_rows_join_the_ledger_with_the_agents_figures() -> None:
    def record(name: str, state: NodeState, gpus: int) -> NodeRecord:
        inv = NodeInventory(
            name=name,
            gpus=[
                GpuInfo(index=i, uuid=f"u{i}", name="H100", gpu_class="h100-80g", memory_mb=1)
                for i in range(gpus)
            ],
        )
        return NodeRecord(inventory=inv, state=state)

    ledger = LedgerState(
        nodes={
            "n1": record("n1", NodeState.READY, 1),
            "n2": record("n2", NodeState.UNREACHABLE, 1),
            "cpu": record("cpu", NodeState.READY, 0).model_copy(
                update={"cordoned": True, "note": "disk swap"}
            ),
        },
        routes={
            "m-0": Route(
                replica_id="m-0",
                model="m",
                node="n1",
                endpoint="http://n1:18000",
                engine="vllm",
                state=ReplicaState.READY,
            ),
            "m-1": Route(
                replica_id="m-1",
                model="m",
                node="n2",
                endpoint="http://n2:18000",
                engine="vllm",
                state=ReplicaState.READY,
                node_unreachable=True,
            ),
        },
    )
    telemetry: dict[str, NodeTelemetry | str] = {
        "n1": NodeTelemetry(
            "n1",
            "nvml",
            gpus=[GpuFigures(0, "H100", utilization_pct=50, throttled=["hw_thermal_slowdown"])],
            engines=[EngineFigures("m-0", "vllm", up=True, running=2, waiting=5)],
        ),
        "n2": "http://n2:8005/metrics: ConnectTimeout",
        "cpu": "its agent serves no metrics (llmgw agent --metrics-port)",
    }
    nodes, replicas = cluster_rows(ledger, telemetry)
    by_name = {n.name: n for n in nodes}
    assert by_name["n1"].gpus[0].warning == "throttled: hw_thermal_slowdown"
    assert by_name["n2"].telemetry_problem == "http://n2:8005/metrics: ConnectTimeout"
    assert by_name["cpu"].telemetry_problem == ""  # no GPUs: nothing is missing
    assert (by_name["cpu"].cordoned, by_name["cpu"].note) == (True, "disk swap")
    (cpu_row,) = rows(lines_of(UiState(), TopData(taken_at=0, nodes=nodes)), "cpu")
    assert cpu_row.split()[1:3] == ["ready,cordoned", "0"]
    assert cpu_row.rstrip().endswith("disk swap")
    m0, m1 = replicas
    assert (m0.running, m0.waiting) == (2, 5)
    assert (m1.running, m1.state) == (None, "ready (node unreachable)")


@pytest.mark.parametrize("pane", [0, 1, 2, 3, 4])
def test_before_the_first_reading(pane: int) -> None:
    lines = render(Screen(None, []), UiState(pane=pane), 80, 10)
    assert lines[0].startswith("llmgw top  reading...")


def test_top_without_a_terminal_says_so_before_reaching_anything() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "top", "--temporal", "127.0.0.1:9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "llmgw top needs a terminal" in done.stderr
