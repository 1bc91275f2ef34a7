"""`llmgw gateway`'s flags, and the gateway's settings made from them."""

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings


def queue_deadline(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not 0 < seconds <= 3600:
        raise argparse.ArgumentTypeError("more than 0 and at most 3600 seconds")
    return seconds


def request_log_size(value: str) -> int:
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if not 0 <= size <= 1_000_000:
        raise argparse.ArgumentTypeError("0 (off) to 1000000 requests")
    return size


def add_gateway_parser(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]", common: argparse.ArgumentParser
) -> None:
    gw = sub.add_parser("gateway", parents=[common], help="run the OpenAI gateway")
    gw.add_argument("--host", default="127.0.0.1")
    gw.add_argument("--port", type=int, default=8000)
    gw.add_argument("--admin-port", type=int, default=8001, help="admin API port, on loopback")
    gw.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway processes sharing --port (one core each); worker i's admin API listens "
        "on --admin-port + i; limits are shared through the store (default 1)",
    )
    gw.add_argument(
        "--temporal-ui",
        default="",
        metavar="URL",
        help="the Temporal web UI the console links each workflow to (default: no links)",
    )
    gw.add_argument(
        "--console-remote",
        action="store_true",
        help="also serve the web console on --host:--port under /console/, behind a login with "
        "an admin key (`llmgw key create NAME --admin`); put TLS in front (default: off, the "
        "console is on the loopback admin listener only)",
    )
    gw.add_argument(
        "--otlp-endpoint",
        default=None,
        metavar="URL",
        help="send the request path's traces to this OTLP/HTTP receiver, e.g. "
        "http://collector:4318 (default: $LLMGW_OTLP_ENDPOINT; unset, no tracing)",
    )
    gw.add_argument(
        "--request-log-size",
        type=request_log_size,
        default=1000,
        metavar="N",
        help="the last N requests each gateway process keeps for the console's Requests and "
        "Charts pages and GET /admin/v1/requests (default: 1000; 0: none, and no charts)",
    )
    gw.add_argument(
        "--media-url-allow",
        action="append",
        default=[],
        metavar="CIDR_OR_HOST",
        help="let media URLs point at this network or host name besides public addresses "
        "(repeatable; by default loopback, private and link-local are refused)",
    )
    gw.add_argument(
        "--routing",
        choices=["prefix", "least_load", "round_robin"],
        default="prefix",
        help="how a replica is chosen (default: longest cached prompt prefix, then load)",
    )
    gw.add_argument(
        "--no-fair-queue",
        dest="fair_queue",
        action="store_false",
        help="send every request straight to an engine rather than holding what the replicas "
        "cannot run at once in the gateway's fair queue (by key weight and priority class)",
    )
    gw.add_argument(
        "--peer-host",
        default="",
        help="the address the other gateway processes on the store reach this one's peer bus "
        "at, and where it listens (default: --host, or this machine's name where --host is a "
        "wildcard); docs/peer-bus.md",
    )
    gw.add_argument(
        "--no-peer-bus",
        dest="peer_bus",
        action="store_false",
        help="route by this process's own record alone, telling other gateway processes nothing",
    )
    gw.add_argument(
        "--queue-deadline",
        type=queue_deadline,
        default=60.0,
        metavar="SECONDS",
        help="the longest a request waits in the fair queue before a 503 with Retry-After "
        "(batch-class requests: ten times as long; default 60)",
    )


def gateway_settings(args: argparse.Namespace) -> "GatewaySettings":
    """`llmgw gateway`'s flags as the gateway's settings."""
    from gateway.settings import GatewaySettings
    from workflows.otel import endpoint_from_env

    return GatewaySettings(
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        console_remote=args.console_remote,
        otlp_endpoint=args.otlp_endpoint if args.otlp_endpoint is not None else endpoint_from_env(),
        request_log_size=args.request_log_size,
        routing_policy=args.routing,
        media_url_allow=args.media_url_allow,
        fair_queue=args.fair_queue,
        queue_deadline_s=args.queue_deadline,
        batch_queue_deadline_s=args.queue_deadline * 10,
        peer_bus=args.peer_bus,
        peer_host=args.peer_host,
    )
