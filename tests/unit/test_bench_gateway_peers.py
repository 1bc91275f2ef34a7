"""The gateway benchmark's peer arms (LiteLLM, the vLLM router): their own environments, the
router's command line, the stand-in's health answer the router waits for, and the lines that
put llmgw beside the router. Offline: nothing is installed or started."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gateway import peer_venv, report, vllm_router_arm
from bench.gateway.options import ARMS, _arms
from bench.gateway.standin import Answers
from bench.gateway.stats import ArmFigures


def test_the_stand_in_answers_the_routers_health_check() -> None:
    answers = Answers(chunks=4)
    health = answers.for_request(b"get /health http/1.1\r\nhost: h", b"")
    assert health == b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    assert answers.for_request(b"post /health http/1.1", b"").startswith(b"HTTP/1.1 404")


def test_the_router_runs_round_robin_in_front_of_the_one_worker() -> None:
    argv = vllm_router_arm.command(Path("/venv/bin/vllm-router"), "http://127.0.0.1:9", 81, 82)
    assert argv[0] == "/venv/bin/vllm-router"

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flag("--worker-urls") == "http://127.0.0.1:9"
    assert flag("--policy") == "round_robin"
    assert (flag("--host"), flag("--port")) == ("127.0.0.1", "81")
    # The metrics exporter cannot be turned off: a port of its own, never its default 29000.
    assert (flag("--prometheus-host"), flag("--prometheus-port")) == ("127.0.0.1", "82")
    assert flag("--worker-startup-check-interval") == "1"
    assert {"--disable-retries", "--disable-circuit-breaker"} <= set(argv)
    assert flag("--log-level") == "error"


def test_the_router_arm_is_last_and_chosen_by_name() -> None:
    assert ARMS[-1] == "vllm-router"
    assert _arms("vllm-router, direct,hop") == ("direct", "hop", "vllm-router")


def test_a_finished_install_is_reused_and_an_unfinished_one_is_not(tmp_path: Path) -> None:
    venv = tmp_path / "peer-venv"
    exe = venv / "bin" / "peer"
    exe.parent.mkdir(parents=True)
    exe.touch()
    (venv / peer_venv.INSTALLED_MARKER).touch()
    assert peer_venv.ensure_installed(venv, "peer==1", "peer", "the peer") == exe
    assert peer_venv.executable_or_reason(True, lambda: exe) == exe


def test_an_arm_that_cannot_be_installed_says_why() -> None:
    def fails() -> Path:
        raise peer_venv.Unavailable("installing the vLLM router failed: no network")

    assert peer_venv.executable_or_reason(False, fails) == "not asked for"
    reason = peer_venv.executable_or_reason(True, fails)
    assert reason == "installing the vLLM router failed: no network"
    with pytest.raises(peer_venv.Unavailable, match="no network"):
        peer_venv.executable(reason)
    assert peer_venv.executable(Path("/x")) == Path("/x")


def _arm(name: str, rps: float, sse: float, us_req: float, us_stream: float) -> ArmFigures:
    return ArmFigures(
        name=name,
        c1_p50_ms=0.2,
        c1_p99_ms=0.4,
        rps_c16=rps,
        rps_c64=rps,
        sse_c16=sse,
        proxy_us_per_req=us_req,
        proxy_us_per_stream=us_stream,
    )


def test_llmgw_is_put_beside_the_vllm_router() -> None:
    llmgw = _arm("llmgw", 2_000, 1_000, 400.0, 900.0)
    router = _arm("vllm-router", 8_000, 4_000, 50.0, 150.0)
    lines = report.ratio_lines([llmgw, router])
    (rps,) = [x for x in lines if x.startswith("llmgw as % of vLLM router:")]
    assert rps.endswith("req/s c16 25%, c64 25%; SSE/s 25%")
    (cpu,) = [x for x in lines if x.startswith("proxy CPU as x vLLM router's:")]
    assert cpu.endswith("per request 8.0x (router 50 us), per stream 6.0x (router 150 us)")
    md = report.markdown([llmgw, router], "setup")
    assert "| vllm-router | 0.200 |" in md
    assert "- llmgw as % of vLLM router:    req/s c16 25%" in md


def test_the_router_lines_say_n_a_when_it_did_not_run() -> None:
    unavailable = ArmFigures(name="vllm-router", unavailable="installing it failed")
    lines = report.ratio_lines([_arm("llmgw", 2_000, 1_000, 400.0, 900.0), unavailable])
    (cpu,) = [x for x in lines if x.startswith("proxy CPU as x vLLM router's:")]
    assert cpu.endswith("per request n/a (router - us), per stream n/a (router - us)")
    assert "vllm-router  unavailable: installing it failed" in report.text_table([unavailable])
