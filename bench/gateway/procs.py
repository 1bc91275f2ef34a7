"""Starting the benchmark's servers as child processes pinned to a core, waiting until they
answer, and stopping them."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Cores:
    """Where things run: the proxy under test alone on one core, the stand-in upstream and the
    load generator together on the other. None when this machine cannot pin (fewer than two
    usable CPUs)."""

    proxy: int | None
    load: int | None

    @classmethod
    def pick(cls) -> Cores:
        usable = sorted(os.sched_getaffinity(0))
        if len(usable) < 2:
            return cls(None, None)
        return cls(usable[0], usable[1])

    @property
    def pinned(self) -> bool:
        return self.proxy is not None


def pin_self(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def _pinned_to(cpu: int | None) -> Callable[[], None] | None:
    if cpu is None:
        return None
    cpus = {cpu}

    def pin() -> None:
        # In the child before exec: everything it starts inherits the core.
        os.sched_setaffinity(0, cpus)

    return pin


class Child:
    """One server process; its output goes to a log file, read back when it fails."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_file: Path,
        cpu: int | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_file = log_file
        with log_file.open("wb") as log:
            self.process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                preexec_fn=_pinned_to(cpu),
                # Its own process group, so stopping it also stops anything it started.
                start_new_session=True,
            )

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def exited(self) -> int | None:
        return self.process.poll()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass


class StartFailed(RuntimeError):
    pass


def http_get(port: int, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def routes_loaded(port: int) -> bool:
    """The gateway on `port` has read its first routing table (a fixed one, version 1)."""
    status, body = http_get(port, "/healthz")
    return status == 200 and json.loads(body).get("routes_version") == 1


def http_post(
    port: int, path: str, body: bytes, headers: Mapping[str, str], timeout_s: float = 30.0
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", path, body=body, headers=dict(headers))
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def wait_until(
    child: Child, ready: Callable[[], bool], timeout_s: float, poll_s: float = 0.1
) -> None:
    """Poll `ready` (connection errors count as not yet) until it holds; StartFailed with the
    child's last log lines if it exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = child.exited()
        if code is not None:
            raise StartFailed(f"{child.name} exited with {code}:\n{child.log_tail()}")
        try:
            if ready():
                return
        except (OSError, http.client.HTTPException):
            pass
        if time.monotonic() > deadline:
            raise StartFailed(
                f"{child.name} not ready after {timeout_s:.0f} s:\n{child.log_tail()}"
            )
        time.sleep(poll_s)


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for_file(path: Path, child: Child, timeout_s: float) -> str:
    wait_until(child, lambda: path.exists() and path.stat().st_size > 0, timeout_s)
    return path.read_text().strip()


@asynccontextmanager
async def gateway_child(
    argv: list[str], log: Path, port: int, key_file: Path | None, timeout_s: float
) -> AsyncIterator[str]:
    """A benchmark's gateway process, from `argv`, once its routes are loaded (on `port`);
    yields the API key it writes to `key_file` ("" with none: it serves another's). Stopped on
    the way out; one that fails to start ends the benchmark, saying why."""
    if key_file is not None:
        await asyncio.to_thread(key_file.unlink, missing_ok=True)
    child = Child("gateway", argv, log, cpu=None)
    try:
        await asyncio.to_thread(wait_until, child, lambda: routes_loaded(port), timeout_s)
        api_key = ""
        if key_file is not None:
            api_key = await asyncio.to_thread(wait_for_file, key_file, child, timeout_s)
        yield api_key
    except StartFailed as exc:
        raise SystemExit(f"the gateway failed to start: {exc}") from exc
    finally:
        await asyncio.to_thread(child.stop)


def environment(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and everything under it, from /proc (0 where that
    cannot be read)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/stat") as f:
                # The fields after the command name, which may itself hold spaces.
                fields = f.read().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, IndexError, ValueError):
            continue
        pending += _children(current)
    return total


@contextmanager
def work_directory(prefix: str, keep: bool) -> Iterator[Path]:
    """A bench's scratch directory (logs, state), removed afterwards unless `keep`."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield workdir
    finally:
        if keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
