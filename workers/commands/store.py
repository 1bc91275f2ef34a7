"""`llmgw key ...`, `llmgw usage` and `llmgw store migrate`: commands that talk to the gateway's
store directly (the SQLite file in the state dir, or $LLMGW_DATABASE_URL), with no Temporal.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import asyncpg

from gateway.usage_export import usage_csv
from store import ApiKey, KeyLimits, KeyNameTaken, Store, open_store
from store.factory import redacted_url
from store.migrate import TargetNotEmpty, migrate
from store.models import DEFAULT_TOP_PRIORITY, MAX_WEIGHT, PRIORITY_CLASSES
from workers.paths import Locations
from workers.tables import table

STORE_COMMANDS = frozenset({"key", "usage", "store"})
CLEAR = "none"  # `llmgw key limit NAME --rpm none` removes that limit
# Request-size limits: (flag, KeyLimits field, help). Left unset, a key has the gateway's own
# setting of the same name; `none` in `key limit` goes back to it.
SIZE_LIMIT_FLAGS = (
    ("--max-prompts", "max_prompts_per_request", "prompts in one request's prompt/input array"),
    ("--max-choices", "max_choices_per_request", "n, best_of, and prompts x n (completions)"),
    ("--max-prompt-tokens", "max_prompt_tokens_per_request", "estimated prompt tokens"),
    (
        "--max-inflight-prompt-tokens",
        "max_inflight_prompt_tokens",
        "estimated prompt tokens of the key's requests in flight together",
    ),
)


# Prefix-cache isolation (gateway/cache_salt.py); `--no-isolate-cache` turns it off.
ISOLATE_FLAG = "--isolate-cache"
LOG_PROMPTS_FLAG = "--log-prompts"


def positive_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not at least 1")
    return value


def key_weight(text: str) -> float:
    """A key's weight in the fair queue: a number above 0, at most MAX_WEIGHT."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    # float() also reads "nan" and "inf"; neither is a share.
    if not (math.isfinite(value) and 0 < value <= MAX_WEIGHT):
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0 and at most {MAX_WEIGHT:g}")
    return value


def count_or_clear(text: str) -> int | str:
    return CLEAR if text.strip().lower() == CLEAR else positive_count(text)


def utc_day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day as YYYY-MM-DD") from None


def names_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",")]


def add_store_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    key = sub.add_parser("key", help="API keys")
    ksub = key.add_subparsers(dest="action", required=True)
    create = ksub.add_parser("create", parents=[common], help="make a key; prints it once")
    create.add_argument("name")
    create.add_argument(
        "--models", type=names_list, help="comma-separated allowlist (default: all models)"
    )
    create.add_argument(
        "--adapters", type=names_list, help="comma-separated LoRA adapters (default: any)"
    )
    create.add_argument("--expires-in-days", type=float)
    create.add_argument(
        "--admin",
        action="store_true",
        help="an admin key: it also logs in to the remote web console (`llmgw gateway "
        "--console-remote`); on the OpenAI API it is an ordinary key",
    )
    _add_limit_flags(
        create, positive_count, "unlimited", "the gateway's default", "shared", "default "
    )

    limit = ksub.add_parser("limit", parents=[common], help="change a key's limits")
    limit.add_argument("name_or_id")
    _add_limit_flags(
        limit,
        count_or_clear,
        "unchanged; `none` removes the limit",
        "unchanged; `none` goes back to the gateway's default",
        "unchanged",
        "unchanged; a new key has ",
    )

    ksub.add_parser("list", parents=[common], help="every key, its allowlists and limits")
    revoke = ksub.add_parser("revoke", parents=[common])
    revoke.add_argument("name_or_id")

    usage = sub.add_parser("usage", parents=[common], help="requests and tokens per key and day")
    usage.add_argument("--key", help="key name or id")
    usage.add_argument("--model")
    usage.add_argument("--since", type=utc_day, metavar="YYYY-MM-DD", help="first UTC day")
    usage.add_argument("--until", type=utc_day, metavar="YYYY-MM-DD", help="last UTC day")
    usage.add_argument("--csv", action="store_true", help="CSV for a spreadsheet")

    store = sub.add_parser("store", help="the gateway's store itself")
    ssub = store.add_subparsers(dest="action", required=True)
    move = ssub.add_parser(
        "migrate",
        parents=[common],
        help="copy keys, usage and secrets to another store, e.g. SQLite to PostgreSQL",
    )
    move.add_argument("--to", required=True, metavar="URL", help="postgresql://... or sqlite:///")
    move.add_argument(
        "--force", action="store_true", help="copy even if the target holds keys or usage"
    )


def _add_limit_flags(
    parser: argparse.ArgumentParser,
    count: Callable[[str], object],
    default_help: str,
    size_default_help: str,
    isolate_default_help: str,
    fair_default_help: str,
) -> None:
    parser.add_argument("--rpm", type=count, help=f"requests per minute ({default_help})")
    parser.add_argument("--tpm", type=count, help=f"tokens per minute ({default_help})")
    parser.add_argument(
        "--budget", type=count, metavar="TOKENS", help=f"tokens per period ({default_help})"
    )
    parser.add_argument("--budget-period", choices=["day", "month"], help="UTC day or month")
    for flag, field, what in SIZE_LIMIT_FLAGS:
        parser.add_argument(flag, dest=field, type=count, help=f"{what} ({size_default_help})")
    parser.add_argument(
        ISOLATE_FLAG,
        dest="isolate_cache",
        action=argparse.BooleanOptionalAction,
        help="a prefix cache of the key's own on vLLM replicas: its prompts never hit blocks "
        f"another key's left cached (--no-isolate-cache shares it; {isolate_default_help})",
    )
    parser.add_argument(
        LOG_PROMPTS_FLAG,
        dest="log_prompts",
        action=argparse.BooleanOptionalAction,
        help="the gateways' request logs keep the text of this key's prompts, cut to 4096 "
        f"characters (--no-log-prompts stops it; {isolate_default_help})",
    )
    # Fair queuing (issue 30): not limits that refuse a request, but how the gateway orders the
    # key's requests against other keys' when a model's replicas are saturated.
    parser.add_argument(
        "--weight",
        type=key_weight,
        metavar="W",
        help="the key's share of a saturated model relative to other keys': 2 is twice the "
        f"tokens of a key of weight 1; above 0, at most {MAX_WEIGHT:g} ({fair_default_help}1)",
    )
    parser.add_argument(
        "--top-priority",
        choices=PRIORITY_CLASSES,
        metavar="CLASS",
        help="the highest priority class the key's requests may ask for: "
        f"{', '.join(PRIORITY_CLASSES)}, highest first ({fair_default_help}{DEFAULT_TOP_PRIORITY}"
        "; critical only for keys given it)",
    )


def limits_to_create(args: argparse.Namespace) -> KeyLimits:
    if args.budget_period and args.budget is None:
        raise SystemExit("--budget-period needs --budget")
    return KeyLimits(
        rpm=args.rpm,
        tpm=args.tpm,
        token_budget=args.budget,
        budget_period=args.budget_period or "day",
        **{field: getattr(args, field) for _, field, _ in SIZE_LIMIT_FLAGS},
        isolate_cache=bool(args.isolate_cache),
        log_prompts=bool(args.log_prompts),
        **_fairness(args),
    )


def _fairness(args: argparse.Namespace) -> dict[str, Any]:
    """--weight and --top-priority where given; a flag left out is the field's default (create)
    or unchanged (limit)."""
    given = {"weight": args.weight, "top_priority": args.top_priority}
    return {field: value for field, value in given.items() if value is not None}


def changed_limits(current: KeyLimits, args: argparse.Namespace) -> KeyLimits:
    """The key's limits with what the flags say applied; a flag left out keeps its value."""
    changes: dict[str, object] = {}
    counts = [("rpm", args.rpm), ("tpm", args.tpm), ("token_budget", args.budget)]
    counts += [(field, getattr(args, field)) for _, field, _ in SIZE_LIMIT_FLAGS]
    for field, value in counts:
        if value is not None:
            changes[field] = None if value == CLEAR else value
    if args.budget_period:
        changes["budget_period"] = args.budget_period
    if args.isolate_cache is not None:
        changes["isolate_cache"] = args.isolate_cache
    if args.log_prompts is not None:
        changes["log_prompts"] = args.log_prompts
    changes |= _fairness(args)
    if not changes:
        flags = ", ".join(
            [
                "--rpm",
                "--tpm",
                "--budget",
                *(f for f, _, _ in SIZE_LIMIT_FLAGS),
                "--budget-period",
                "--weight",
                "--top-priority",
            ]
        )
        raise SystemExit(
            f"nothing to change: give {flags}, --[no-]isolate-cache or --[no-]log-prompts"
        )
    return KeyLimits.model_validate(current.model_dump() | changes)


def describe_limits(limits: KeyLimits) -> str:
    parts = []
    if limits.rpm is not None:
        parts.append(f"rpm {limits.rpm}")
    if limits.tpm is not None:
        parts.append(f"tpm {limits.tpm}")
    if limits.token_budget is not None:
        parts.append(f"budget {limits.token_budget}/{limits.budget_period}")
    for flag, field, _ in SIZE_LIMIT_FLAGS:
        value = getattr(limits, field)
        if value is not None:
            parts.append(f"{flag.removeprefix('--')} {value}")
    if limits.isolate_cache:
        parts.append(ISOLATE_FLAG.removeprefix("--"))
    if limits.log_prompts:
        parts.append(LOG_PROMPTS_FLAG.removeprefix("--"))
    # Shown only where they differ from a new key's, like the limits above shown only when set.
    if limits.weight != KeyLimits().weight:
        parts.append(f"weight {limits.weight:.15g}")
    if limits.top_priority != DEFAULT_TOP_PRIORITY:
        parts.append(f"top-priority {limits.top_priority}")
    return ", ".join(parts) or "none"


KEY_LIST_HEADERS = [
    "NAME",
    "ID",
    "MODELS",
    "ADAPTERS",
    "LIMITS",
    "ROLE",
    "CREATED",
    "EXPIRES",
    "STATE",
]


def key_state(key: ApiKey, now: datetime) -> str:
    if key.revoked_at is not None:
        return "revoked"
    return "expired" if key.is_expired(now) else "active"


def key_rows(keys: list[ApiKey], now: datetime) -> list[list[str]]:
    return [
        [
            k.name,
            k.key_id,
            ",".join(k.models) if k.models is not None else "all",
            ",".join(k.adapters) if k.adapters is not None else "any",
            describe_limits(k.limits),
            "admin" if k.admin else "client",
            k.created_at.strftime("%Y-%m-%d %H:%M"),
            k.expires_at.strftime("%Y-%m-%d %H:%M") if k.expires_at else "-",
            key_state(k, now),
        ]
        for k in keys
    ]


def run_store_command(args: argparse.Namespace, where: Locations) -> None:
    """Run one store command; a problem ends it with SystemExit and a message."""
    try:
        asyncio.run(_with_store(args, where))
    except ValueError as err:  # KeyNameTaken and pydantic's ValidationError included
        raise SystemExit(f"invalid input: {err}") from None


async def _with_store(args: argparse.Namespace, where: Locations) -> None:
    store = open_store(where.database_url, where.state_dir)
    await store.init()
    try:
        await store_command(args, store, where)
    finally:
        await store.close()


async def store_command(args: argparse.Namespace, store: Store, where: Locations) -> None:
    if args.command == "usage":
        await show_usage(args, store)
    elif args.command == "store":
        await migrate_command(args, store, where)
    elif args.action == "create":
        await create_key(args, store)
    elif args.action == "limit":
        await limit_key(args, store)
    elif args.action == "list":
        print(table(KEY_LIST_HEADERS, key_rows(await store.list_keys(), datetime.now(UTC))))
    elif args.action == "revoke":
        if not await store.revoke_key(args.name_or_id):
            raise SystemExit(f"no active key {args.name_or_id!r}")
        print(f"revoked {args.name_or_id}")


async def create_key(args: argparse.Namespace, store: Store) -> None:
    expires = None
    if args.expires_in_days is not None:
        if args.expires_in_days <= 0:
            raise SystemExit("--expires-in-days must be more than 0")
        expires = datetime.now(UTC) + timedelta(days=args.expires_in_days)
    try:
        record, secret = await store.create_key(
            args.name,
            models=args.models,
            expires_at=expires,
            adapters=args.adapters,
            limits=limits_to_create(args),
            admin=args.admin,
        )
    except KeyNameTaken as err:
        raise SystemExit(str(err)) from None
    role = "admin key" if record.admin else "key"
    print(f"{role} {record.name} ({record.key_id}) created; it is shown only this once:")
    print(secret)


async def limit_key(args: argparse.Namespace, store: Store) -> None:
    active = [
        k
        for k in await store.list_keys()
        if k.revoked_at is None and args.name_or_id in (k.key_id, k.name)
    ]
    if not active:
        raise SystemExit(f"no active key {args.name_or_id!r}")
    limits = changed_limits(active[0].limits, args)
    record = await store.set_key_limits(active[0].key_id, limits)
    if record is None:
        raise SystemExit(f"key {args.name_or_id!r} was revoked meanwhile")
    print(f"key {record.name} ({record.key_id}) limits: {describe_limits(record.limits)}")


async def show_usage(args: argparse.Namespace, store: Store) -> None:
    keys = await store.list_keys()
    names = {k.key_id: k.name for k in keys}
    key_ids: list[str | None] = [None]
    if args.key:
        # A name can belong to several keys over time (revoked, then made again): show them all.
        key_ids = [k.key_id for k in keys if args.key in (k.name, k.key_id)]
        if not key_ids:
            raise SystemExit(f"no key {args.key!r}")
    rows = [
        row
        for key_id in key_ids
        for row in await store.usage(
            key_id=key_id, model=args.model, since=args.since, until=args.until
        )
    ]
    rows.sort(key=lambda r: (r.day, r.key_id, r.model))
    if args.csv:
        sys.stdout.write(usage_csv(rows, names))
        return
    print(
        table(
            ["DAY", "KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL"],
            [
                [
                    str(u.day),
                    names.get(u.key_id, u.key_id),
                    u.model,
                    str(u.requests),
                    str(u.prompt_tokens),
                    str(u.completion_tokens),
                    str(u.total_tokens),
                ]
                for u in rows
            ],
        )
    )


async def migrate_command(args: argparse.Namespace, source: Store, where: Locations) -> None:
    shown = redacted_url(args.to)
    target = open_store(args.to, where.state_dir)
    try:
        try:
            await target.init()
        except (OSError, asyncpg.PostgresError) as err:
            raise SystemExit(f"cannot open the target store {shown}: {err}") from None
        try:
            report = await migrate(source, target, force=args.force)
        except TargetNotEmpty as err:
            raise SystemExit(f"{shown}: {err}") from None
    finally:
        await target.close()
    print(f"copied to {shown}:")
    master = "engine master secret included" if report.master_secret else "no master secret yet"
    print(f"  secrets     {report.secrets} ({master})")
    print(f"  keys        {report.keys}")
    print(f"  usage rows  {report.usage_rows}")
    print("read back from the target: every row matches")
