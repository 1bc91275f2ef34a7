"""`llmgw gateway --workers N`: each worker binds the shared public port with SO_REUSEPORT and
gets an admin port of its own; nonsense counts are refused before anything starts."""

from __future__ import annotations

import pytest

from gateway.server import listen
from gateway.settings import GatewaySettings
from workers.gateway_main import check_workers, worker_settings


def test_workers_share_the_public_port_and_get_their_own_admin_port() -> None:
    settings = GatewaySettings(port=8000, admin_port=8001)
    ports = [
        (worker_settings(settings, i).port, worker_settings(settings, i).admin_port)
        for i in range(3)
    ]
    assert ports == [(8000, 8001), (8000, 8002), (8000, 8003)]


def test_two_workers_can_listen_on_one_port_only_with_reuse_port() -> None:
    first = listen("127.0.0.1", 0, reuse_port=True)
    port = first.getsockname()[1]
    try:
        second = listen("127.0.0.1", port, reuse_port=True)
        second.listen()
        second.close()
        first.listen()
        with pytest.raises(RuntimeError, match="cannot listen"):
            listen("127.0.0.1", port)
    finally:
        first.close()


def test_worker_counts_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        check_workers(GatewaySettings(), 0)
    with pytest.raises(ValueError, match="fixed --port"):
        check_workers(GatewaySettings(port=0), 2)
    with pytest.raises(ValueError, match="65535"):
        check_workers(GatewaySettings(admin_port=65535), 2)
    with pytest.raises(ValueError, match="console-remote needs --workers 1"):
        check_workers(GatewaySettings(console_remote=True), 2)
    check_workers(GatewaySettings(console_remote=True), 1)
    check_workers(GatewaySettings(), 4)
