"""Switching traces on: one variable or flag, a clear error for a bad URL, nothing started
without one."""

import pytest

from workers.cli import build_parser
from workers.commands.gateway_flags import gateway_settings
from workflows import otel


def test_the_receivers_traces_url_is_under_its_endpoint() -> None:
    assert otel.traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert otel.traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert otel.traces_url("https://c.example/v1/traces") == "https://c.example/v1/traces"
    with pytest.raises(ValueError, match="LLMGW_OTLP_ENDPOINT must be an http"):
        otel.traces_url("collector:4318")


def test_nothing_starts_without_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(otel.ENDPOINT_ENV, raising=False)
    assert not otel.start("llmgw-test")
    assert not otel.enabled()
    assert otel.temporal_interceptors() == []
    with pytest.raises(RuntimeError, match="not started"):
        otel.tracer("x")


def test_the_gateway_takes_its_endpoint_from_the_flag_or_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(otel.ENDPOINT_ENV, raising=False)
    assert gateway_settings(build_parser().parse_args(["gateway"])).otlp_endpoint == ""
    monkeypatch.setenv(otel.ENDPOINT_ENV, "http://from-env:4318")
    assert gateway_settings(build_parser().parse_args(["gateway"])).otlp_endpoint == (
        "http://from-env:4318"
    )
    flagged = ["gateway", "--otlp-endpoint", "http://from-flag:4318"]
    assert gateway_settings(build_parser().parse_args(flagged)).otlp_endpoint == (
        "http://from-flag:4318"
    )
