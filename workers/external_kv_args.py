"""`llmgw model add --engine external` options for the endpoints' KV-cache events: one
`--kv-event-source` per `--url`, in the same order, with the engines' `--kv-block-size` and
`--kv-hash-seed`. They become the profile's `external_kv` (workflows/contracts/models.py),
checked again by the catalog (workflows/external_kv.py); no secret is involved.
"""

import argparse

from workflows.catalog import EXTERNAL
from workflows.contracts import ExternalKv, KvEventSource
from workflows.external_kv import endpoint_problems

SOURCE_FLAG = "--kv-event-source"
_OPTIONS = ("replay", "topic")


def add_external_kv_arguments(add: argparse.ArgumentParser) -> None:
    add.add_argument(
        SOURCE_FLAG,
        action="append",
        default=[],
        metavar="tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T]",
        help="--engine external: where the gateway reaches this URL's vLLM KV-event publisher "
        "(the engine runs --kv-events-config with endpoint tcp://*:PORT, "
        "--enable-prefix-caching and --prefix-caching-hash-algo sha256_cbor), and its replay "
        "socket; once per --url, in the same order. Plain, unauthenticated ZMQ: keep it on a "
        "trusted network",
    )
    add.add_argument(
        "--kv-block-size",
        type=int,
        metavar="N",
        help=f"with {SOURCE_FLAG}: the engines' --block-size (vLLM's default is 16 on GPUs)",
    )
    add.add_argument(
        "--kv-hash-seed",
        metavar="SEED",
        help=f"with {SOURCE_FLAG}: the PYTHONHASHSEED the engines were started with. Without "
        "it vLLM up to 0.28 hashes blocks from random bytes nobody can reproduce, so no "
        "request would match: start them with PYTHONHASHSEED set and give it here. Leave it "
        "out only for vLLM 0.29 or later started without PYTHONHASHSEED",
    )


def external_kv_from_args(args: argparse.Namespace) -> ExternalKv | None:
    """The profile's external_kv from the command line, or None when no source is given.
    Raises SystemExit naming the option at fault."""
    sources: list[str] = args.kv_event_source
    if not sources:
        for flag, value in (
            ("--kv-block-size", args.kv_block_size),
            ("--kv-hash-seed", args.kv_hash_seed),
        ):
            if value is not None:
                raise SystemExit(f"{flag} goes with {SOURCE_FLAG}")
        return None
    if args.engine != EXTERNAL:
        raise SystemExit(
            f"{SOURCE_FLAG} is for --engine {EXTERNAL}; a {args.engine} model llmgw runs "
            "publishes its KV events with --kv-events"
        )
    if len(sources) != len(args.url):
        raise SystemExit(
            f"{SOURCE_FLAG}: one per --url, in the same order: {len(args.url)} --url, "
            f"{len(sources)} {SOURCE_FLAG}"
        )
    if args.kv_block_size is None:
        raise SystemExit(
            f"--kv-block-size: give the engines' --block-size with {SOURCE_FLAG} (vLLM's "
            "default is 16 on GPUs)"
        )
    return ExternalKv(
        sources=[parse_source(text, i) for i, text in enumerate(sources, 1)],
        block_size=args.kv_block_size,
        hash_seed=args.kv_hash_seed,
    )


def parse_source(text: str, number: int = 1) -> KvEventSource:
    """`tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T]`; SystemExit naming the
    `number`th --kv-event-source when it is not."""
    where = f"{SOURCE_FLAG} #{number} ({text!r})"
    endpoint, *rest = text.split(",")
    options: dict[str, str] = {}
    for part in rest:
        name, sep, value = part.partition("=")
        if not sep or name not in _OPTIONS:
            raise SystemExit(
                f"{where}: after the endpoint come replay=... and topic=..., not {part!r}"
            )
        if name in options:
            raise SystemExit(f"{where}: {name} is given twice")
        options[name] = value
    for name, value in (("endpoint", endpoint), ("replay", options.get("replay", ""))):
        if name == "endpoint" or value:
            problems = endpoint_problems(value)
            if problems:
                raise SystemExit(f"{SOURCE_FLAG} #{number}: {name} {'; '.join(problems)}")
    return KvEventSource(
        endpoint=endpoint, replay=options.get("replay", ""), topic=options.get("topic", "")
    )
