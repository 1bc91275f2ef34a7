"""`llmgw up` as the campaign runs it: the real thing (Temporal dev server, control worker,
agent, gateway, llama-server), in a state dir of its own on free ports, with the demo model at
two replicas of one core each (the demo's own profile asks for two cores, and two of those do
not fit a 2-core machine). The weights are reached through a link in the state dir, so this
campaign's engines are told from any other llmgw's by their command line."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engines.local_port import free_port
from workers.demo import DEMO_MODEL, demo_spec, demo_weights
from workflows.client import connect
from workflows.contracts import ModelSpec
from workflows.model.client import apply_model

NODE = "chaos"
READY_LINE = "Ctrl-C stops everything"


class UpProcess:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.port, self.admin_port, self.temporal_port = free_port(), free_port(), free_port()
        self.kv_feed_port = free_port()
        self.log = state_dir / "up.log"
        self.weights = state_dir / "weights" / demo_weights().name
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def temporal(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def api_key(self) -> str:
        return (self.state_dir / "quickstart.key").read_text().strip()

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LLMGW_STATE_DIR"] = str(self.state_dir)
        env["LLMGW_TEMPORAL_ADDRESS"] = self.temporal
        env.pop("LLMGW_DATABASE_URL", None)
        return env

    def start(self, timeout_s: float = 120.0) -> None:
        self.weights.parent.mkdir(parents=True, exist_ok=True)
        if not self.weights.exists():
            self.weights.symlink_to(demo_weights())
        cmd = [
            sys.executable, "-m", "workers.cli", "up", "--node", NODE, "--headless", "--no-demo",
            "--port", str(self.port), "--admin-port", str(self.admin_port),
            "--temporal-port", str(self.temporal_port), "--kv-feed-port", str(self.kv_feed_port),
            "--agent-metrics-port", str(free_port()),
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while READY_LINE not in self.log.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"llmgw up did not start; its output:\n{self.tail()}")
            time.sleep(0.2)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no output)"

    def model_spec(self, replicas: int) -> ModelSpec:
        spec = demo_spec(cpu_cores=1)
        return spec.model_copy(update={"replicas": replicas, "weights": str(self.weights)})

    async def define_model(self, replicas: int) -> str:
        client = await connect(self.temporal)
        await apply_model(client, self.model_spec(replicas))
        return DEMO_MODEL

    def stop(self, grace_s: float = 90.0) -> None:
        """Ctrl-C, as a user would: `up` stops its children and sweeps the engines."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
