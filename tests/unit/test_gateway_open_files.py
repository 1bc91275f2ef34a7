"""The gateway raises its soft limit on open files to the hard limit when it starts serving:
each client and each engine connection is a file, and a soft limit of 1024 is common."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Opens sockets until it has `count` or the limit stops it, before and after the raise.
CHILD = """
import json, socket, resource
from gateway.server import raise_open_files_limit

def sockets_opened(count):
    held = []
    try:
        for _ in range(count):
            held.append(socket.socket())
    except OSError:
        pass
    opened = len(held)
    for s in held:
        s.close()
    return opened

before = sockets_opened(400)
returned = raise_open_files_limit()
print(json.dumps({
    "before": before,
    "returned": returned,
    "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
    "after": sockets_opened(400),
}))
"""


def _limited_to(soft: int, hard: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_gateway_under_a_low_soft_limit_raises_it_to_the_hard_limit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: _limited_to(256, 512),
        check=True,
    )
    seen = json.loads(done.stdout)
    assert seen["before"] < 256, "the soft limit stopped the child before the raise"
    assert seen["returned"] == seen["soft"] == 512
    assert seen["after"] == 400
