"""`llmgw up`: the whole system on one machine, with real parts.

An embedded Temporal server (SQLite file, web UI), the control worker, this machine's agent and
the gateway, each its own process; the demo model defined if missing. Ctrl-C stops everything,
engines included. Running it again finds the same models, keys and usage.
"""

import asyncio
import fcntl
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import httpx
from temporalio.client import Client

from activities.agent.node_agent import AgentConfig, NodeAgentActivities
from activities.control.server_config import ConfigError, load_server_config
from store import Store, open_store
from store.fleet import FleetTables
from workers.children import Child, Children
from workers.connect import connect_with_retry
from workers.demo import DEMO_MODEL, demo_spec
from workers.paths import Locations
from workers.payload_key import up_payload_key
from workers.progress import engine_lines, fleet_tables, ledger_snapshot
from workers.secret_files import write_secret_file
from workers.signals import stop_event, wait_or_stop
from workers.temporal_flags import PAYLOAD_KEY_VARIABLE, SECURITY_VARIABLES
from workers.temporal_server import TemporalDevServer
from workflows.contracts import ReplicaState
from workflows.engine_keys import node_secret
from workflows.model.client import define_if_missing
from workflows.payload_codec import PayloadKeyError

log = logging.getLogger("llmgw.up")


@dataclass
class UpOptions:
    node: str
    host: str = "127.0.0.1"
    port: int = 8000
    admin_port: int = 8001
    temporal_port: int = 7233
    ui_port: int | None = 8233
    # This machine's agent serves its engines' KV-cache events here, on loopback; 0: not at all.
    kv_feed_port: int = 8003
    # The mirror of model artifacts (llmgw mirror serve), on loopback, for this machine's agent;
    # 0: not served, and models defined from a source cannot start here.
    mirror_port: int = 8004
    # This machine's agent serves its Prometheus metrics (GPU telemetry, engine load) here, on
    # loopback, for `llmgw nodes`, `llmgw top` and Prometheus; 0: not served.
    metrics_port: int = 8005
    demo: bool = True
    engine_paths: dict[str, str] = field(default_factory=dict)
    config_file: Path | None = None
    # Make a payload key in the state dir if there is none (workers/payload_key.py).
    encrypt_payloads: bool = False


def say(text: str) -> None:
    print(text, flush=True)


def lock_state_dir(state_dir: Path) -> IO[str]:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    handle = (state_dir / "up.lock").open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"another `llmgw up` is running with state dir {state_dir}") from None
    return handle


async def ensure_demo_key(store: Store, key_file: Path) -> str:
    """A ready API key for the quick start, kept (0600) in the state dir so every `up` can print a
    curl line that works; made anew if it was revoked or lost."""
    if key_file.exists():  # noqa: ASYNC240 - a tiny file, read once at start-up
        secret = key_file.read_text().strip()  # noqa: ASYNC240
        key_id = secret.split("-")[1] if secret.count("-") >= 2 else ""
        record = await store.get_key(key_id)
        if record is not None and record.revoked_at is None:
            return secret
    existing = {k.name for k in await store.list_keys() if k.revoked_at is None}
    name = "quickstart"
    n = 1
    while name in existing:
        n += 1
        name = f"quickstart-{n}"
    _, secret = await store.create_key(name)
    write_secret_file(key_file, secret)
    return secret


def child_env(where: Locations) -> dict[str, str]:
    env = dict(os.environ)
    env["LLMGW_STATE_DIR"] = str(where.state_dir)
    env["LLMGW_TEMPORAL_ADDRESS"] = where.temporal
    # The children talk to the plaintext dev server `up` runs, whatever TLS settings this shell
    # has for a cluster elsewhere.
    for variable in SECURITY_VARIABLES:
        env.pop(variable, None)
    # The payload key is not a connection setting: every child seals with `up`'s own.
    env.pop(PAYLOAD_KEY_VARIABLE, None)
    if where.security.payload_key_file is not None:
        env[PAYLOAD_KEY_VARIABLE] = str(where.security.payload_key_file)
    if where.database_url:
        env["LLMGW_DATABASE_URL"] = where.database_url
    # This environment's tools first: engines and the stand-in engine find the same Python.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def start_children(where: Locations, opts: UpOptions) -> Children:
    children = Children(env=child_env(where))
    for child in planned_children(where, opts):
        children.add(child)
    return children


def planned_children(where: Locations, opts: UpOptions) -> list[Child]:
    """The children `up` runs and their command lines, none started yet."""
    logs = where.state_dir / "logs"
    run = where.state_dir / "run"
    agent_args = ["agent", "--node", opts.node, "--stop-engines-on-exit"]
    agent_args += ["--kv-feed-port", str(opts.kv_feed_port)]
    agent_args += ["--metrics-port", str(opts.metrics_port)]
    if opts.mirror_port:
        agent_args += ["--mirror", f"http://127.0.0.1:{opts.mirror_port}"]
    for engine, path in opts.engine_paths.items():
        agent_args += ["--engine-path", f"{engine}={path}"]
    gateway_args = ["gateway", "--host", opts.host, "--port", str(opts.port)]
    gateway_args += ["--admin-port", str(opts.admin_port)]
    if opts.ui_port:
        gateway_args += ["--temporal-ui", f"http://127.0.0.1:{opts.ui_port}"]
    control_args = ["control"]
    if opts.config_file is not None:
        control_args += ["--config", str(opts.config_file)]
    roles = [("control", control_args), ("agent", agent_args), ("gateway", gateway_args)]
    if opts.mirror_port:
        mirror_args = ["mirror", "serve", "--host", "127.0.0.1", "--port", str(opts.mirror_port)]
        roles.append(("mirror", mirror_args))
    return [Child(name, args, logs / f"{name}.log", run / f"{name}.pid") for name, args in roles]


async def wait_until_serving(
    client: Client,
    fleet: FleetTables,
    model: str,
    stop: asyncio.Event,
    tick: Callable[[], Awaitable[None]],
) -> bool:
    """Print what happens until a replica of the model is ready; False if stopped first.
    `tick` runs every second, so a process that dies during a long first build is revived."""
    last = ""
    while not stop.is_set():
        await tick()
        try:
            state = await ledger_snapshot(fleet)
        except Exception:  # noqa: BLE001 - unreadable for any reason is not ready yet; keep ticking
            state = None
        if state is not None:
            routes = [r for r in state.routes.values() if r.model == model]
            ready = [r for r in routes if r.state == ReplicaState.READY]
            # The ledger may still hold a route from before a restart: trust the engine itself.
            if ready and await answers_health(ready[0].endpoint):
                return True
            lines = []
            for record in state.nodes.values():
                lines += await engine_lines(client, record)
            lines += [f"{r.replica_id}: {r.state.value} {r.detail}".strip() for r in routes]
            text = "; ".join(lines) or "waiting for this machine's agent to register"
            if text != last:
                say(f"  ... {text}")
                last = text
        await wait_or_stop(stop, 1.0)
    return False


async def answers_health(endpoint: str, path: str = "/health") -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            return (await http.get(f"{endpoint}{path}")).status_code == 200
    except httpx.HTTPError:
        return False


async def wait_until_gateway_answers(
    opts: UpOptions, stop: asyncio.Event, tick: Callable[[], Awaitable[None]]
) -> None:
    """The banner promises an API that answers: wait for the gateway's listener, reviving a
    gateway that died on the way (a port taken, a store not ready)."""
    host = "127.0.0.1" if opts.host in ("0.0.0.0", "::", "") else opts.host
    endpoint = f"http://{host}:{opts.port}"
    while not stop.is_set() and not await answers_health(endpoint, "/healthz"):
        await tick()
        await wait_or_stop(stop, 0.2)


def banner(opts: UpOptions, where: Locations, api_key: str) -> str:
    base = f"http://{opts.host}:{opts.port}"
    ui = f"http://127.0.0.1:{opts.ui_port}" if opts.ui_port else "(headless)"
    body = '{"model": "' + DEMO_MODEL + '", "messages": [{"role": "user", "content": "Say hello"}]}'
    lines = [
        "",
        "llmgw is up.",
        f"  OpenAI API:   {base}/v1",
        f"  API key:      {api_key}",
        f"  Admin API:    http://127.0.0.1:{opts.admin_port}/admin/v1 (this machine only)",
        f"  Console:      http://127.0.0.1:{opts.admin_port}/admin/console/ (this machine only)",
        f"  Temporal UI:  {ui}",
        f"  State:        {where.state_dir}",
    ]
    if opts.demo:
        lines += [
            "",
            "Try it:",
            f"  curl -s {base}/v1/chat/completions \\",
            f"    -H 'Authorization: Bearer {api_key}' -H 'Content-Type: application/json' \\",
            f"    -d '{body}'",
        ]
    lines += ["", "Ctrl-C stops everything."]
    return "\n".join(lines)


def write_pid(path: Path, server: TemporalDevServer) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert server.process is not None
    path.write_text(str(server.process.pid))


def sweep_engines(where: Locations, node: str) -> int:
    """Stop any engine an agent left behind (an agent killed with -9 cannot stop its own)."""
    config = AgentConfig(
        node=node,
        address="",
        state_dir=where.state_dir,
        cache_dir=where.cache_dir,
        node_secret=b"",
    )
    return len([r for r in NodeAgentActivities(config).stop_all_engines() if r.was_running])


async def run_up(where: Locations, opts: UpOptions) -> None:
    # The state dir holds the store (API key hashes, the engine-key master secret), node secrets
    # and Temporal's database: nothing in it is for other users of this machine. The children
    # inherit this.
    os.umask(0o077)
    try:
        # Checked here, before anything starts: a control worker would only restart on it.
        load_server_config(opts.config_file)
    except ConfigError as err:
        raise SystemExit(f"configuration: {err}") from None
    lock = lock_state_dir(where.state_dir)
    try:
        payload_key = up_payload_key(where.state_dir, os.environ, opts.encrypt_payloads)
    except PayloadKeyError as err:
        raise SystemExit(str(err)) from None
    if payload_key is not None:
        where = replace(where, security=replace(where.security, payload_key_file=payload_key))
        say(f"Temporal payloads encrypted with the key in {payload_key}")
    stop = stop_event()
    store = open_store(where.database_url, where.state_dir)
    await store.init()
    master = await store.master_secret()
    write_secret_file(where.node_secret_file(opts.node), node_secret(master, opts.node).hex())
    api_key = await ensure_demo_key(store, where.state_dir / "quickstart.key")
    await store.close()

    server = TemporalDevServer(
        where.state_dir / "temporal.db",
        where.state_dir / "logs" / "temporal.log",
        opts.temporal_port,
        opts.ui_port,
    )
    say(f"starting Temporal ({where.state_dir / 'temporal.db'})")
    await asyncio.to_thread(server.start)
    pid_file = where.state_dir / "run" / "temporal.pid"
    write_pid(pid_file, server)
    where = replace(where, temporal=server.address)
    children: Children | None = None
    try:
        children = start_children(where, opts)
        say("started the control worker, this machine's agent and the gateway")

        async def revive() -> None:
            assert children is not None
            if server.exited() is not None:
                # Everything durable is in its SQLite file; the others reconnect by themselves.
                say(f"Temporal exited with status {server.exited()}; started it again")
                await asyncio.to_thread(server.start)
                write_pid(pid_file, server)
            for child, code in children.restart_dead():
                say(f"{child.name} exited with status {code}; started it again")

        client = await connect_with_retry(where)
        if opts.demo:
            spec = demo_spec(cpu_cores=min(2, os.cpu_count() or 1))
            if await define_if_missing(client, spec):
                say(f"defined the demo model {spec.name}")
            say(f"waiting for {DEMO_MODEL} to serve (the first run builds llama.cpp)")
            fleet = await fleet_tables(where)
            try:
                await wait_until_serving(client, fleet, DEMO_MODEL, stop, revive)
            finally:
                await fleet.close()
        await wait_until_gateway_answers(opts, stop, revive)
        if not stop.is_set():
            say(banner(opts, where, api_key))
        while not stop.is_set():
            await revive()
            await wait_or_stop(stop, 1.0)
        say("stopping")
    finally:
        if children is not None:
            await asyncio.to_thread(children.stop_all)
        await asyncio.to_thread(server.stop)
        swept = await asyncio.to_thread(sweep_engines, where, opts.node)
        if swept:
            say(f"stopped {swept} engine(s) left behind")
        lock.close()
        say("stopped")


def main(where: Locations, opts: UpOptions) -> None:
    asyncio.run(run_up(where, opts))
