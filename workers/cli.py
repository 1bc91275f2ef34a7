"""The `llmgw` command."""

import argparse
import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

from pydantic import ValidationError

from workers import doctor
from workers.commands.engine import add_engine_parsers
from workers.commands.gateway_flags import add_gateway_parser, gateway_settings
from workers.commands.ledger import add_ledger_parsers, run_ledger_command
from workers.commands.mirror import MIRROR_COMMAND, add_mirror_parsers, run_mirror_command
from workers.commands.model import add_model_parsers
from workers.commands.node import add_node_parsers, parse_labels
from workers.commands.store import STORE_COMMANDS, add_store_parsers, run_store_command
from workers.paths import Locations, default_node_name
from workers.temporal_flags import add_temporal_arguments, namespace_from, security_from
from workers.verbosity import add_verbose_argument
from workflows import options
from workflows.client import PLAINTEXT
from workflows.payload_codec import PayloadKeyError
from workflows.temporal_security import TemporalSecurityError

# The modules under bench/ that `llmgw bench NAME` runs (`make bench-NAME` runs the same).
BENCHMARKS = ("placement", "gateway", "abuse", "routing", "chaos")


def parse_engine_paths(values: list[str]) -> dict[str, str]:
    paths = {}
    for value in values:
        engine, sep, path = value.partition("=")
        if not sep or not engine or not path:
            raise SystemExit(f"--engine-path wants ENGINE=PATH, got {value!r}")
        paths[engine] = str(Path(path).resolve())
    return paths


def refresh_interval(value: str) -> float:
    seconds = float(value)
    if not 0.5 <= seconds <= 3600:
        raise argparse.ArgumentTypeError("between 0.5 and 3600 seconds")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    local = argparse.ArgumentParser(add_help=False)
    local.add_argument("--state-dir", help="default $LLMGW_STATE_DIR or ~/.local/state/llmgw")
    local.add_argument("--database-url", help="PostgreSQL URL, default $LLMGW_DATABASE_URL")
    add_verbose_argument(local)
    # `up` runs its own Temporal server: only the others take an address, namespace and TLS.
    common = argparse.ArgumentParser(add_help=False, parents=[local])
    add_temporal_arguments(common)

    parser = argparse.ArgumentParser(prog="llmgw", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", parents=[local], help="run everything on this machine")
    up.add_argument("--node", default=default_node_name())
    up.add_argument("--host", default="127.0.0.1", help="gateway address")
    up.add_argument("--port", type=int, default=8000, help="gateway port")
    up.add_argument("--admin-port", type=int, default=8001, help="admin API port, on loopback")
    up.add_argument("--temporal-port", type=int, default=7233)
    up.add_argument(
        "--kv-feed-port",
        type=int,
        default=8003,
        help="the agent's KV feed to the gateway, on loopback (0: none)",
    )
    up.add_argument(
        "--mirror-port",
        type=int,
        default=8004,
        help="the mirror of model artifacts for this machine's agent, on loopback (0: none)",
    )
    up.add_argument(
        "--agent-metrics-port",
        type=int,
        default=8005,
        help="the agent's Prometheus metrics (GPU telemetry, engine load), on loopback (0: none)",
    )
    up.add_argument("--ui-port", type=int, default=8233, help="Temporal web UI port")
    up.add_argument("--headless", action="store_true", help="no Temporal web UI")
    up.add_argument("--no-demo", action="store_true", help="do not define the demo model")
    up.add_argument(
        "--encrypt-payloads",
        action="store_true",
        help="encrypt every Temporal payload with a key made in STATE_DIR/payload.key; once it "
        "exists, up always uses it ($LLMGW_PAYLOAD_KEY_FILE names another)",
    )
    up.add_argument("--engine-path", action="append", default=[], metavar="ENGINE=PATH")
    up.add_argument("--config", help="server configuration YAML, default $LLMGW_CONFIG")

    control = sub.add_parser("control", parents=[common], help="run the control-plane worker")
    control.add_argument("--config", help="server configuration YAML, default $LLMGW_CONFIG")

    agent = sub.add_parser("agent", parents=[common], help="run this machine's node agent")
    agent.add_argument(
        "what",
        nargs="?",
        choices=["inventory"],
        help="inventory: print what the scheduler would see of this machine, and exit",
    )
    agent.add_argument("--json", action="store_true", help="with inventory: the record as JSON")
    agent.add_argument("--node", default=default_node_name())
    agent.add_argument("--address", default="127.0.0.1", help="address engines listen on")
    agent.add_argument("--engine-path", action="append", default=[], metavar="ENGINE=PATH")
    agent.add_argument("--stop-engines-on-exit", action="store_true")
    agent.add_argument(
        "--install-os-packages",
        action="store_true",
        help="install a library an engine lacks (libgomp1, ...) from this node's own package "
        "sources with apt-get or dnf; needs root (default: say the command instead)",
    )
    agent.add_argument(
        "--kv-feed-port",
        type=int,
        default=0,
        help="serve the engines' KV-cache events to gateways on --address at this port "
        "(default 0: not served)",
    )
    agent.add_argument(
        "--mirror",
        metavar="URL",
        default="",
        help="the control plane's mirror of model artifacts, e.g. http://control:8004 "
        "(default: none; models with an artifact cannot start here)",
    )
    agent.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics (GPU telemetry, engine load) at this port "
        "(default 0: not served)",
    )
    agent.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="the address the metrics listen on (default loopback; Prometheus on another "
        "machine needs the node's address)",
    )
    agent.add_argument(
        "--join",
        metavar="TOKEN",
        default=os.environ.get("LLMGW_JOIN_TOKEN"),
        help="the token `llmgw node add` printed (default $LLMGW_JOIN_TOKEN)",
    )
    agent.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    agent.add_argument("--heartbeat-every", type=float, default=10.0, metavar="SECONDS")
    agent.add_argument(
        "--lost-after",
        type=float,
        default=45.0,
        metavar="SECONDS",
        help="silent this long (while the control plane is up), the node is unreachable: "
        "gateways stop sending it requests, its engines keep running (default 45)",
    )
    agent.add_argument(
        "--gone-after",
        type=float,
        default=options.NODE_GONE_GRACE.total_seconds(),
        metavar="SECONDS",
        help="silent this long, the node is lost and its replicas start elsewhere (default 300)",
    )

    secret = sub.add_parser(
        "secret",
        parents=[local],
        help="secrets this node's engines reference by name (env NAME: secret:<name>)",
    )
    secret.add_argument("--node", default=default_node_name())
    secret.add_argument("action", choices=["set", "rm", "ls"])
    secret.add_argument("name", nargs="?", help="the secret's name (set and rm); set reads stdin")

    add_gateway_parser(sub, common)

    sub.add_parser("status", parents=[common], help="nodes and replicas")
    sub.add_parser("nodes", parents=[common], help="nodes, their hardware and engines")
    sub.add_parser(
        "fetches", parents=[common], help="models' weights being fetched onto nodes, and how far"
    )
    top = sub.add_parser(
        "top", parents=[common], help="a live view of nodes, GPUs, replicas, traffic and quotas"
    )
    top.add_argument(
        "--admin",
        default="http://127.0.0.1:8001",
        metavar="URL",
        help="the gateway's admin listener, on this machine (default http://127.0.0.1:8001)",
    )
    top.add_argument(
        "--every", type=refresh_interval, default=2.0, metavar="SECONDS", help="default 2"
    )
    top.add_argument(
        "--ollama-store", metavar="DIR", help="Ollama's store for `i` (default $OLLAMA_MODELS)"
    )
    add_node_parsers(sub, common)
    add_engine_parsers(sub, common)
    # bench/ sits above workers/ (it drives these processes), so the CLI hands a benchmark to its
    # module by name instead of importing it.
    bench = sub.add_parser("bench", help="benchmarks (commands, not tests): bench/<name>.py")
    bench.add_argument("bench", choices=BENCHMARKS, help="which benchmark")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="its own arguments (--help)")
    # The doctor reads this machine only: it brings its own --state-dir and needs no Temporal.
    doctor.add_arguments(
        sub.add_parser("doctor", help="check what this node's GPUs, fabric and engines need")
    )

    add_model_parsers(sub, common)
    # The mirror is files in the state dir: its commands need no Temporal address.
    add_mirror_parsers(sub)
    add_ledger_parsers(sub, common)

    add_store_parsers(sub, common)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=log_level(args), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    try:
        where = locations(args)
        dispatch(args, where)
    except (TemporalSecurityError, PayloadKeyError) as err:
        raise SystemExit(f"Temporal connection settings: {err}") from None
    except ValidationError as err:
        raise SystemExit(f"invalid input: {err}") from None
    except KeyboardInterrupt:
        sys.exit(130)


# The commands that run a process and log what it does (workers/verbosity.py).
PROCESSES = frozenset({"control", "agent", "gateway"})


def log_level(args: argparse.Namespace) -> int:
    serves = args.command == MIRROR_COMMAND and args.action == "serve"
    if args.command in PROCESSES or serves or getattr(args, "verbose", False):
        return logging.INFO
    return logging.WARNING


def locations(args: argparse.Namespace) -> Locations:
    """Where things are, and how this command reaches Temporal. Only commands that take
    --temporal connect to it; `up` runs its own plaintext dev server, and the rest (doctor,
    secret, mirror) never connect, so a TLS variable meant for others does not stop them."""
    connects = hasattr(args, "temporal")
    where = Locations.resolve(
        getattr(args, "state_dir", None),
        getattr(args, "temporal", None),
        getattr(args, "database_url", None),
        namespace=namespace_from(args, os.environ) if connects else None,
        security=security_from(args, os.environ) if connects else PLAINTEXT,
    )
    if connects and args.command not in STORE_COMMANDS:
        # Every file read once now: a missing key stops the process at start with its name,
        # rather than after two minutes of connection retries.
        where.security.check()
    return where


def lost_after(args: argparse.Namespace) -> float:
    if args.lost_after < 2 * args.heartbeat_every:
        raise SystemExit("--lost-after must be at least twice --heartbeat-every")
    return float(args.lost_after)


def gone_after(args: argparse.Namespace) -> float:
    if args.gone_after < args.lost_after:
        raise SystemExit("--gone-after must be at least --lost-after")
    return float(args.gone_after)


def join(where: Locations, args: argparse.Namespace) -> Locations:
    """Take a join token: keep the node's secret, and use the token's node name and Temporal
    address unless the command line names them."""
    from dataclasses import replace

    from workers.join import JoinToken, accept_join_token

    try:
        token = JoinToken.decode(args.join)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if args.node not in (token.node, default_node_name()):
        raise SystemExit(f"this token joins node {token.node!r}, not {args.node!r}")
    args.node = token.node
    accept_join_token(where, token)
    return where if args.temporal else replace(where, temporal=token.temporal)


def dispatch(args: argparse.Namespace, where: Locations) -> None:
    from workers import admin

    if args.command == "up":
        from workers.up import UpOptions
        from workers.up import main as up_main

        up_main(
            where,
            UpOptions(
                node=args.node,
                host=args.host,
                port=args.port,
                admin_port=args.admin_port,
                temporal_port=args.temporal_port,
                kv_feed_port=args.kv_feed_port,
                mirror_port=args.mirror_port,
                metrics_port=args.agent_metrics_port,
                ui_port=None if args.headless else args.ui_port,
                demo=not args.no_demo,
                engine_paths=parse_engine_paths(args.engine_path),
                config_file=where.config_file(args.config),
                encrypt_payloads=args.encrypt_payloads,
            ),
        )
    elif args.command == "control":
        from workers.control import main as control_main

        control_main(where, where.config_file(args.config))
    elif args.command == "agent" and args.what == "inventory":
        from workers.commands import agent_inventory

        agent_inventory.run(args, where.state_dir, parse_engine_paths(args.engine_path))
    elif args.command == "agent":
        from workers.agent import AgentOptions
        from workers.agent import main as agent_main

        if args.join:
            where = join(where, args)
        agent_main(
            where,
            AgentOptions(
                node=args.node,
                labels=parse_labels(args.label),
                heartbeat_s=args.heartbeat_every,
                lost_after_s=lost_after(args),
                gone_after_s=gone_after(args),
                address=args.address,
                engine_paths=parse_engine_paths(args.engine_path),
                stop_engines_on_exit=args.stop_engines_on_exit,
                install_os_packages=args.install_os_packages,
                kv_feed_port=args.kv_feed_port,
                mirror=args.mirror,
                metrics_host=args.metrics_host,
                metrics_port=args.metrics_port,
            ),
        )
    elif args.command == "bench":
        command = [sys.executable, "-m", f"bench.{args.bench}", *args.bench_args]
        sys.exit(subprocess.call(command))
    elif args.command == "doctor":
        sys.exit(doctor.run(args))
    elif getattr(args, "runner", None) is not None:  # a command that brings its own
        args.runner(args, where)
    elif args.command == "gateway":
        from workers.gateway_main import main as gateway_main

        gateway_main(where, gateway_settings(args), args.workers, args.temporal_ui)
    elif args.command == "secret":
        from activities.agent.node_secrets import main as secret_main

        words = [args.action, *([args.name] if args.name else [])]
        sys.exit(secret_main(words, where.state_dir / "agent" / args.node / "secrets"))
    elif args.command == MIRROR_COMMAND:
        run_mirror_command(args, where)
    elif args.command in STORE_COMMANDS:
        # No Temporal client here, so a plain exit (and SystemExit for tests) is safe.
        run_store_command(args, where)
    else:
        if args.command == "top" and not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise SystemExit("llmgw top needs a terminal; `llmgw status` prints the cluster once")
        code = 0
        try:
            if args.command == "ledger":
                asyncio.run(run_ledger_command(args, where))
            else:
                asyncio.run(admin.run_command(args, where))
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
        except ValueError as err:
            print(f"invalid input: {err}", file=sys.stderr)
            code = 2
        except KeyboardInterrupt:
            code = 130  # Ctrl-C (in `llmgw top`, say): the terminal is already given back
        # The Temporal client's native runtime can call into Python while the interpreter
        # finalizes and abort it ("PyGILState_Release ... must be current"), turning a command
        # that succeeded into exit status 134. Nothing is left to clean up here: leave directly.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
