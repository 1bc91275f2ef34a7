"""Runs a shard that is more than one process: sidecars first, then the engine. Standard
library only: the agent runs it as `python -I shard_launcher.py PLAN`, isolated from any
PYTHON* variable and from the project's own imports.

It leads the shard's process group (the supervisor starts it in its own session), so every
command it starts is in that group and a stop of the group reaches them all. Before a command
with `wait_for`, it waits (bounded) for that host:port to accept connections, failing the shard
if a sidecar dies or the time runs out. Once all are started it waits: when the last command
exits, the sidecars are stopped and the launcher ends the same way the last command did (the
same exit code, or the same signal), so the shard's exit is the engine's. A sidecar that exits
first ends the shard too: the engine cannot work without its Ray head or join, nor be reached
without its key guard.

PLAN is JSON: {"commands": [{"argv": [...], "wait_for": [host, port] | null, "env_drop": [...]}],
"wait_s": N}; a command is started without the environment variables its `env_drop` names (a key
meant for a sidecar alone), `env_drop` may be left out.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

POLL_S = 0.2
GRACE_S = 10.0


def _say(line: str) -> None:
    print(f"llmgw launcher: {line}", flush=True)


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _end_like(code: int) -> int:
    """Exit as the engine did: re-raise its signal on ourselves, or return its code."""
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be caught anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1.0)
        return 128 - code
    return code


def _name(proc: subprocess.Popen[bytes]) -> str:
    args = proc.args
    return str(args[0]) if isinstance(args, list) and args else str(args)


def run(plan: dict[str, Any]) -> int:
    commands = plan["commands"]
    if not isinstance(commands, list) or not commands:
        _say("the plan names no command")
        return 2
    wait_s = float(plan.get("wait_s", 300.0))
    # A stop signals the whole group: the commands get it themselves, and the launcher stays
    # to collect the engine's exit and stop whatever is left.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    started: list[subprocess.Popen[bytes]] = []
    for i, command in enumerate(commands):
        argv = [str(a) for a in command["argv"]]
        wait_for = command.get("wait_for")
        if wait_for:
            host, port = str(wait_for[0]), int(wait_for[1])
            _say(f"waiting up to {wait_s:.0f}s for {host}:{port} before {argv[0]}")
            deadline = time.monotonic() + wait_s
            while not _listening(host, port):
                dead = next((p for p in started if p.poll() is not None), None)
                if dead is not None:
                    _say(f"{_name(dead)} exited with {dead.returncode} while waiting")
                    _stop(started)
                    return 1
                if time.monotonic() >= deadline:
                    _say(f"{host}:{port} was not listening after {wait_s:.0f}s")
                    _stop(started)
                    return 1
                time.sleep(POLL_S)
        kind = "engine" if i == len(commands) - 1 else "sidecar"
        _say(f"starting {kind}: {' '.join(argv)}")
        drop = {str(name) for name in command.get("env_drop") or ()}
        env = {name: value for name, value in os.environ.items() if name not in drop}
        started.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env))
    engine, sidecars = started[-1], started[:-1]
    while True:
        code = engine.poll()
        if code is not None:
            _say(f"engine exited with {code}")
            _stop(sidecars)
            return _end_like(code)
        dead = next((p for p in sidecars if p.poll() is not None), None)
        if dead is not None:
            _say(f"sidecar {_name(dead)} exited with {dead.returncode}: stopping the shard")
            _stop(started)
            return 1
        time.sleep(POLL_S)


def main() -> int:
    return run(json.loads(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
