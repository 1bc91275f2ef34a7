"""`llmgw node bootstrap`: make this machine a node of a cluster, in one command.

It checks everything first (the token, the flags, that the control plane answers and would take
this token), then plans (workers/commands/node_bootstrap/plan.py), then writes the agent's
systemd unit, its environment file and its directories, and starts the service where systemd
runs. Nothing is written when a check fails; a second run with the same flags changes nothing.
"""

import argparse
import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path

from workers.commands.node_bootstrap import checks, observe
from workers.commands.node_bootstrap.control_plane import node_view, reach, wait_ready
from workers.commands.node_bootstrap.execute import ActionFailed, execute
from workers.commands.node_bootstrap.plan import Plan, Request, Systemctl, plan, touched_paths
from workers.commands.node_bootstrap.unit import UNIT_NAME, start_command
from workers.join import JoinToken
from workers.paths import Locations
from workers.temporal_flags import add_temporal_arguments
from workflows.node.proof import identity_key


class Refused(Exception):
    """A check failed before anything was written."""


def add_bootstrap_parser(nsub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    cmd = nsub.add_parser(
        "bootstrap",
        help="make this machine a node: the agent's systemd unit, settings and state, started",
        description="Make this machine a node: check the join token with the control plane, "
        "write the agent's systemd unit, its settings (the token in a 0600 file) and state "
        "directory, and start it. Nothing is written when a check fails; a second run with the "
        "same flags changes nothing. docs/nodes.md, 'Bootstrap a node'.",
    )
    cmd.set_defaults(runner=run_bootstrap)  # workers/cli.py dispatch runs it
    add_temporal_arguments(cmd)
    cmd.add_argument(
        "--join",
        metavar="TOKEN",
        default=os.environ.get("LLMGW_JOIN_TOKEN"),
        help="the token `llmgw node add` printed; - reads it from stdin (default "
        "$LLMGW_JOIN_TOKEN)",
    )
    cmd.add_argument("--address", help="where engines listen (default: this machine's "
                     "address on the route to the control plane)")  # fmt: skip
    cmd.add_argument("--metrics-port", type=int, default=8005, help="0: none (default 8005)")
    cmd.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    cmd.add_argument("--engine-path", action="append", default=[], metavar="ENGINE=PATH")
    cmd.add_argument("--mirror", default="", metavar="URL", help="the control plane's mirror")
    cmd.add_argument("--install-os-packages", action="store_true",
                     help="passed to the agent (which then runs as root)")  # fmt: skip
    cmd.add_argument("--agent-arg", action="append", default=[], metavar="ARG",
                     help="one more word for the agent's command line, e.g. "
                     "--agent-arg=--heartbeat-every=5 (repeatable)")  # fmt: skip
    cmd.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                     help="one more variable for the agent (PIP_INDEX_URL, a proxy)")  # fmt: skip
    cmd.add_argument("--user", help="the service user, made if missing (default llmgw; root "
                     "with --install-os-packages)")  # fmt: skip
    cmd.add_argument("--llmgw", help="the llmgw executable the unit runs (default: this one)")
    cmd.add_argument("--config-dir", default="/etc/llmgw")
    cmd.add_argument("--unit-dir", default="/etc/systemd/system")
    cmd.add_argument("--state-dir", default="/var/lib/llmgw")
    cmd.add_argument("--cache-dir", default="/var/cache/llmgw")
    cmd.add_argument("--no-service", action="store_true",
                     help="write the files, start nothing")  # fmt: skip
    cmd.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                     help="how long to wait for the node to be ready (default 60)")  # fmt: skip
    cmd.add_argument("--dry-run", action="store_true",
                     help="check and print every action, do none")  # fmt: skip


def read_token(given: str | None) -> JoinToken:
    if not given:
        raise Refused("--join TOKEN is needed (the token `llmgw node add NAME` printed)")
    text = sys.stdin.readline() if given == "-" else given
    try:
        return JoinToken.decode(text)
    except ValueError as err:
        raise Refused(f"the join token is malformed: {err}") from None


def executable(given: str | None) -> str:
    beside = Path(sys.executable).with_name("llmgw")
    path = Path(given).absolute() if given else beside
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise Refused(f"{path} is not an executable llmgw: name it with --llmgw PATH")
    return str(path)


def engine_paths(values: list[str]) -> dict[str, str]:
    paths = {}
    for value in values:
        engine, sep, path = value.partition("=")
        if not sep or not engine or not Path(path).exists():
            raise Refused(f"--engine-path wants ENGINE=PATH of an existing file, got {value!r}")
        paths[engine] = str(Path(path).resolve())
    return paths


def local_request(args: argparse.Namespace, where: Locations, token: JoinToken) -> Request:
    """The request from the flags alone, its address still to be found; raises ValueError."""
    config_dir = Path(args.config_dir).absolute()
    checks.plain(str(config_dir), "--config-dir")
    if not 0 <= args.metrics_port <= 65535:
        raise ValueError(f"--metrics-port {args.metrics_port}: not a port")
    if os.geteuid() != 0 and not args.dry_run:
        raise ValueError("writing the unit and /etc/llmgw needs root: run it with sudo")
    return Request(
        node=token.node, token=token.encode(), namespace=where.namespace,
        security=where.security, address=args.address or "",
        metrics_port=args.metrics_port,
        user=checks.service_user(args.user, args.install_os_packages),
        llmgw=checks.plain(executable(args.llmgw), "the llmgw path"),
        agent_flags=checks.agent_flags(
            args.label, engine_paths(args.engine_path), args.mirror, args.install_os_packages,
            args.temporal, args.agent_arg,
        ),
        extra_env=checks.extra_env(args.env), config_dir=config_dir,
        unit_dir=Path(args.unit_dir).absolute(), state_dir=Path(args.state_dir).absolute(),
        cache_dir=Path(args.cache_dir).absolute(), service=not args.no_service,
    )  # fmt: skip


async def checked_request(args: argparse.Namespace, where: Locations) -> tuple[Request, str]:
    """The request, and the Temporal address the agent dials; raises Refused."""
    token = read_token(args.join)
    temporal = args.temporal or token.temporal
    try:
        request = local_request(args, where, token)
        client = await reach(temporal, where.namespace, where.security)
        view = await node_view(client, token.node)
        refusal = checks.token_refusal(
            token.node, temporal, identity_key(token.secret), view, observe.machine_id()
        )
        if refusal is not None:
            raise ValueError(refusal)
        address = request.address or observe.address_towards(temporal)
        request = replace(request, address=checks.plain(address, "--address"))
    except ValueError as err:
        raise Refused(str(err)) from None
    return request, temporal


def planned(request: Request) -> tuple[Plan, bool]:
    """The plan, and whether systemd runs here."""
    try:
        machine = observe.look(request, touched_paths(request))
        return plan(request, machine), machine.systemd
    except ValueError as err:
        raise Refused(str(err)) from None


async def bootstrap(args: argparse.Namespace, where: Locations) -> int:
    request, temporal = await checked_request(args, where)
    the_plan, systemd = planned(request)
    print(
        f"node {request.node}: joins the control plane at {temporal} "
        f"({where.security.describe()}, namespace {request.namespace}); engines listen on "
        f"{request.address}"
    )
    if args.dry_run:
        for action in the_plan.actions:
            print(f"  would {action.describe()}")
        print("--dry-run: nothing was changed." if the_plan.actions else "nothing to change.")
        return 0
    for action in the_plan.actions:
        try:
            execute(action)
        except ActionFailed as err:
            print(f"  FAILED: {err}", file=sys.stderr)
            return 1
        print(f"  did: {action.describe()}")
    if not the_plan.actions:
        print(f"nothing to change: all {len(the_plan.in_place)} things were already in place.")
    return await report(request, temporal, where, the_plan, systemd, args.wait)


async def report(
    request: Request, temporal: str, where: Locations, the_plan: Plan, systemd: bool, wait: float
) -> int:
    if not systemd or not request.service:
        why = (
            "--no-service: nothing was started"
            if not request.service
            else f"systemd is not running here (no {observe.SYSTEMD_RUNTIME}): nothing was started"
        )
        print(f"{why}. Start the agent (as root, in the foreground) with:")
        print(f"  {start_command(the_plan.unit)}")
        if systemd:
            print(f"or as the service: systemctl enable --now {UNIT_NAME}")
        print(f"It joins as node {request.node}. Then, where the control plane runs: llmgw nodes")
        return 0
    state = observe.systemctl_says("is-active")
    print(f"{UNIT_NAME}: {state or 'unknown'}, {observe.systemctl_says('is-enabled')}")
    started = any(isinstance(a, Systemctl) for a in the_plan.actions)
    node_state = "not asked"
    if wait > 0:
        client = await reach(temporal, where.namespace, where.security)
        node_state = await wait_ready(client, request.node, observe.machine_id(), wait)
    print(f"node {request.node}: {node_state}" + ("" if started else " (service not restarted)"))
    print("Check it: `llmgw nodes` where the control plane runs; here, "
          f"`journalctl -u {UNIT_NAME} -f`")  # fmt: skip
    return 0 if node_state.startswith("ready") or wait <= 0 else 1


def run_bootstrap(args: argparse.Namespace, where: Locations) -> None:
    try:
        code = asyncio.run(bootstrap(args, where))
    except Refused as err:
        print(f"llmgw node bootstrap: {err}\nNothing was written.", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    # As workers/cli.py's commands do: leave before the Temporal client's native runtime can
    # abort the interpreter's finalisation.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
