"""The processes `llmgw up` runs: each a plain `llmgw <command>` child with its own log, restarted
if it dies, stopped in order on the way out."""

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Child:
    name: str
    args: list[str]
    log_file: Path
    pid_file: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    def start(self, env: dict[str, str]) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "workers.cli", *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                # Its own group: Ctrl-C reaches `up`, which stops the children in order.
                start_new_session=True,
            )
        self.pid_file.write_text(str(self.process.pid))

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, grace_s: float) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.pid_file.unlink(missing_ok=True)


@dataclass
class Children:
    env: dict[str, str]
    children: list[Child] = field(default_factory=list)

    def add(self, child: Child) -> None:
        self.children.append(child)
        child.start(self.env)

    def restart_dead(self) -> list[tuple[Child, int]]:
        """Start again any child that died; returns who died and with what status."""
        died = []
        for child in self.children:
            code = child.exited()
            if code is not None:
                died.append((child, code))
                child.restarts += 1
                child.start(self.env)
        return died

    def stop_all(self, grace_s: float = 20.0) -> None:
        # Reverse start order: the gateway stops taking requests before engines go away.
        for child in reversed(self.children):
            child.stop(grace_s)
