"""Ports for the processes a test starts, chosen so that nothing else takes them first.

A port from the kernel (bind to port 0) lies in the ephemeral range (32768-60999 here), the
same range every outgoing connection's local port is drawn from: between choosing it and the
test's process binding it, any connection on the machine may take it. With three workers, a
fresh-clone run met it: `llmgw up`'s gateway found its admin port in use for two minutes and
never started. These ports come from below that range, in a block of this test process's own
(one per pytest-xdist worker, one for a run without workers), each checked free when handed
out."""

import itertools
import os
import re
import socket

FIRST = 20000
BLOCK = 1200  # ten blocks end at 32000, below the ephemeral range
BLOCKS = 10


def _block() -> int:
    """gw0..gw8 take blocks 1..9; a process without xdist (the forced pass) takes block 0."""
    worker = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return 0 if worker is None else 1 + int(worker.group(1)) % (BLOCKS - 1)


_candidates = itertools.cycle(range(FIRST + _block() * BLOCK, FIRST + (_block() + 1) * BLOCK))


def free_port() -> int:
    """A loopback port free now that no other test process and no outgoing connection will
    be handed."""
    for _ in range(BLOCK):
        port = next(_candidates)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # held by this process, or by something outside the suite
            return port
    raise RuntimeError(f"no free port in this test process's block of {BLOCK}")
