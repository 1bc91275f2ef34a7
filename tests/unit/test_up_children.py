"""What `llmgw up` starts its children with: its agent serves the KV feed and its metrics on the
ports asked."""

from pathlib import Path

from workers.cli import build_parser
from workers.paths import Locations
from workers.up import UpOptions, planned_children


def agent_args(opts: UpOptions, tmp_path: Path) -> list[str]:
    where = Locations(tmp_path, tmp_path / "cache", "127.0.0.1:7233", "default", None)
    [agent] = [c for c in planned_children(where, opts) if c.name == "agent"]
    assert agent.process is None  # planned, not started: nothing is left running
    return agent.args


def test_up_gives_its_agent_a_kv_feed_port(tmp_path: Path) -> None:
    parser = build_parser()
    assert parser.parse_args(["up"]).kv_feed_port == 8003
    assert parser.parse_args(["agent"]).kv_feed_port == 0  # a standalone agent: no feed
    args = agent_args(UpOptions(node="n", kv_feed_port=9123), tmp_path)
    assert args[args.index("--kv-feed-port") + 1] == "9123"
    off = agent_args(UpOptions(node="n", kv_feed_port=0), tmp_path)
    assert off[off.index("--kv-feed-port") + 1] == "0"


def test_up_gives_its_agent_a_metrics_port(tmp_path: Path) -> None:
    parser = build_parser()
    assert parser.parse_args(["up"]).agent_metrics_port == 8005
    assert parser.parse_args(["agent"]).metrics_port == 0  # a standalone agent: not served
    assert parser.parse_args(["agent"]).metrics_host == "127.0.0.1"
    args = agent_args(UpOptions(node="n", metrics_port=9124), tmp_path)
    assert args[args.index("--metrics-port") + 1] == "9124"
