"""A free TCP port on loopback, for a process about to be started on it (the llama.cpp smoke
test, the embedded Temporal server, benchmarks and tests). The port is free when asked; a
process that starts later could in principle take it first, so callers that care retry."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
