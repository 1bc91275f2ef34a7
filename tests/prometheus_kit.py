"""A real Prometheus for tests: Debian's `prometheus` binary (installed by `make prometheus`)
on a free loopback port, a scratch data dir, and a config made from
deploy/prometheus/prometheus.yml with its targets pointed where the test's processes listen
and a short scrape interval; and reads of its HTTP API."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.ports import free_port

DEPLOY_CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "prometheus.yml"
PROMETHEUS = "prometheus"
PROMTOOL = "promtool"


def missing_binaries() -> list[str]:
    return [name for name in (PROMETHEUS, PROMTOOL) if shutil.which(name) is None]


def scratch_config(targets: Mapping[str, str], scrape_interval_s: int) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with each job's one target replaced by `targets[job]`
    and every interval set to `scrape_interval_s`: the jobs, paths and schemes stay the
    deployed ones, so a wrong metrics_path there fails the live test too."""
    config: dict[str, Any] = yaml.safe_load(DEPLOY_CONFIG.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    if unknown := set(targets) - set(jobs):
        raise ValueError(f"no such job in {DEPLOY_CONFIG.name}: {sorted(unknown)}")
    config["global"]["scrape_interval"] = f"{scrape_interval_s}s"
    config["global"]["evaluation_interval"] = f"{scrape_interval_s}s"
    config["scrape_configs"] = [
        {**jobs[name], "static_configs": [{"targets": [target]}]}
        for name, target in targets.items()
    ]
    return config


@dataclass
class Prometheus:
    url: str
    http: httpx.Client

    def api(self, path: str, **params: Any) -> Any:
        """The `data` of an API answer; a refusal (a PromQL error) raises with Prometheus'
        own words."""
        answer = self.http.get(f"{self.url}/api/v1/{path}", params=params)
        body = answer.json()
        if body.get("status") != "success":
            raise PromQLError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def targets_up(self) -> dict[str, bool]:
        active = self.api("targets", state="active")["activeTargets"]
        return {target["scrapePool"]: target["health"] == "up" for target in active}

    def last_errors(self) -> dict[str, str]:
        active = self.api("targets", state="active")["activeTargets"]
        return {target["scrapePool"]: target["lastError"] for target in active}


class PromQLError(AssertionError):
    pass


@contextmanager
def running(work: Path, config: Mapping[str, Any]) -> Iterator[Prometheus]:
    """Prometheus with `config`, its data in `work`, until the block ends."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "prometheus.yml"
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    port = free_port()
    log = (work / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={path}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=10, trust_env=False) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if http.get(f"{url}/-/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        "prometheus did not start:\n" + (work / "prometheus.log").read_text()
                    )
                time.sleep(0.1)
            yield Prometheus(url, http)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
