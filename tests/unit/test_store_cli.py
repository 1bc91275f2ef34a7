"""`llmgw key`, `llmgw usage` and `llmgw store migrate` run through workers.cli.main, as an
operator types them, against a temporary state dir."""

from __future__ import annotations

import asyncio
import csv
import io
import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

from store import KeyLimits, StoreDump, UsageDelta, open_store
from tests.unit.test_store import PG_URL, _drop_schema, _postgres_schema
from workers.cli import main


def llmgw(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run one command; its stdout, or pytest.fail with its message if it exits."""
    try:
        main(list(argv))
    except SystemExit as stop:
        pytest.fail(f"llmgw {' '.join(argv)} exited: {stop.code}")
    return capsys.readouterr().out


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run a command that must fail; its message (SystemExit text or argparse's stderr)."""
    with pytest.raises(SystemExit) as stop:
        main(list(argv))
    assert stop.value.code not in (0, None)
    return str(stop.value.code) + capsys.readouterr().err


@pytest.fixture
def state(tmp_path: Path) -> list[str]:
    return ["--state-dir", str(tmp_path)]


@pytest.fixture
def postgres_url() -> Iterator[str]:
    schema = asyncio.run(_postgres_schema())
    yield f"{PG_URL}?search_path={schema}"
    asyncio.run(_drop_schema(schema))


def _limits_of(state_dir: str, name: str) -> KeyLimits:
    async def read() -> KeyLimits:
        store = open_store(None, Path(state_dir))
        await store.init()
        try:
            (key,) = [k for k in await store.list_keys() if k.name == name and not k.revoked_at]
            return key.limits
        finally:
            await store.close()

    return asyncio.run(read())


def _dump(url: str | None, state_dir: Path) -> StoreDump:
    async def read() -> StoreDump:
        store = open_store(url, state_dir)
        await store.init()
        try:
            return await store.export_dump()
        finally:
            await store.close()

    return asyncio.run(read())


def _add_usage(state_dir: Path, rows: list[UsageDelta]) -> None:
    async def write() -> None:
        store = open_store(None, state_dir)
        await store.init()
        await store.add_usage(rows)
        await store.close()

    asyncio.run(write())


def test_create_with_everything_then_list_it(
    capsys: pytest.CaptureFixture[str], state: list[str]
) -> None:
    out = llmgw(
        capsys,
        "key", "create", "tuned", *state,
        "--models", "llama, qwen", "--adapters", "sql-lora",
        "--rpm", "60", "--tpm", "9000", "--budget", "500000", "--budget-period", "month",
        "--expires-in-days", "30",
    )  # fmt: skip
    assert "shown only this once" in out
    assert re.search(r"^llmgw-[0-9a-f]{8}-\S{43}$", out, re.MULTILINE)
    llmgw(capsys, "key", "create", "plain", *state)

    listing = llmgw(capsys, "key", "list", *state).splitlines()
    header, tuned, plain = listing
    assert header.split()[:5] == ["NAME", "ID", "MODELS", "ADAPTERS", "LIMITS"]
    assert "llama,qwen" in tuned
    assert "sql-lora" in tuned
    assert "rpm 60, tpm 9000, budget 500000/month" in tuned
    assert tuned.rstrip().endswith("active")
    assert "all" in plain
    assert "any" in plain
    assert " none " in plain
    assert re.search(r"\s-\s+active$", plain), "no expiry shows as -"
    assert " client " in plain

    out = llmgw(capsys, "key", "create", "ops", "--admin", *state)
    assert out.startswith("admin key ops (")
    (ops,) = [line for line in llmgw(capsys, "key", "list", *state).splitlines() if "ops" in line]
    assert " admin " in ops


def test_limit_changes_only_what_it_names(
    capsys: pytest.CaptureFixture[str], state: list[str]
) -> None:
    llmgw(capsys, "key", "create", "svc", *state, "--rpm", "10", "--budget", "100")
    out = llmgw(capsys, "key", "limit", "svc", *state, "--rpm", "none", "--tpm", "50")
    assert "tpm 50, budget 100/day" in out
    assert _limits_of(state[1], "svc") == KeyLimits(tpm=50, token_budget=100)
    llmgw(capsys, "key", "limit", "svc", *state, "--budget-period", "month")
    assert _limits_of(state[1], "svc").budget_period == "month"


def test_size_limits_are_set_shown_and_given_back_to_the_gateway(
    capsys: pytest.CaptureFixture[str], state: list[str]
) -> None:
    llmgw(capsys, "key", "create", "batch", *state, "--max-prompts", "512", "--max-choices", "4")
    assert _limits_of(state[1], "batch") == KeyLimits(
        max_prompts_per_request=512, max_choices_per_request=4
    )
    out = llmgw(
        capsys, "key", "limit", "batch", *state,
        "--max-prompts", "none", "--max-prompt-tokens", "2000",
        "--max-inflight-prompt-tokens", "9000",
    )  # fmt: skip
    assert "max-choices 4, max-prompt-tokens 2000, max-inflight-prompt-tokens 9000" in out
    # `none` is the gateway's default again, not unlimited.
    assert _limits_of(state[1], "batch") == KeyLimits(
        max_choices_per_request=4,
        max_prompt_tokens_per_request=2000,
        max_inflight_prompt_tokens=9000,
    )
    zero = refused(capsys, "key", "limit", "batch", *state, "--max-choices", "0")
    assert "not at least 1" in zero


def test_cache_isolation_is_set_shown_and_switched_off(
    capsys: pytest.CaptureFixture[str], state: list[str]
) -> None:
    llmgw(capsys, "key", "create", "tenant", *state, "--rpm", "60", "--isolate-cache")
    llmgw(capsys, "key", "create", "shared", *state)
    assert _limits_of(state[1], "tenant") == KeyLimits(rpm=60, isolate_cache=True)
    assert _limits_of(state[1], "shared").isolate_cache is False
    _, tenant, shared = llmgw(capsys, "key", "list", *state).splitlines()
    assert "rpm 60, isolate-cache" in tenant
    assert "isolate-cache" not in shared

    out = llmgw(capsys, "key", "limit", "tenant", *state, "--no-isolate-cache")
    assert "limits: rpm 60\n" in out
    assert _limits_of(state[1], "tenant") == KeyLimits(rpm=60)
    out = llmgw(capsys, "key", "limit", "shared", *state, "--isolate-cache")
    assert "limits: isolate-cache" in out
    # Another limit's change leaves it as it is.
    llmgw(capsys, "key", "limit", "shared", *state, "--tpm", "500")
    assert _limits_of(state[1], "shared") == KeyLimits(tpm=500, isolate_cache=True)


def test_prompt_logging_is_set_shown_and_switched_off(
    capsys: pytest.CaptureFixture[str], state: list[str]
) -> None:
    llmgw(capsys, "key", "create", "audited", *state, "--log-prompts")
    assert _limits_of(state[1], "audited") == KeyLimits(log_prompts=True)
    _, audited = llmgw(capsys, "key", "list", *state).splitlines()
    assert "log-prompts" in audited
    out = llmgw(capsys, "key", "limit", "audited", *state, "--no-log-prompts")
    assert "limits: none" in out
    assert _limits_of(state[1], "audited") == KeyLimits()


def test_weight_and_top_priority_are_set_shown_and_changed(
    capsys: pytest.CaptureFixture[str], state: list[str]
) -> None:
    out = llmgw(
        capsys, "key", "create", "ops", *state, "--weight", "2.5", "--top-priority", "critical"
    )
    assert "created" in out
    llmgw(capsys, "key", "create", "plain", *state, "--rpm", "60")
    assert _limits_of(state[1], "ops") == KeyLimits(weight=2.5, top_priority="critical")
    assert _limits_of(state[1], "plain") == KeyLimits(rpm=60)
    _, ops, plain = llmgw(capsys, "key", "list", *state).splitlines()
    assert "weight 2.5, top-priority critical" in ops
    # A new key's weight 1 and "interactive" are not spelled out, like limits not set.
    assert "rpm 60 " in plain
    assert "weight" not in plain
    assert "top-priority" not in plain

    out = llmgw(capsys, "key", "limit", "plain", *state, "--weight", "0.5")
    assert "limits: rpm 60, weight 0.5\n" in out
    out = llmgw(capsys, "key", "limit", "plain", *state, "--top-priority", "batch")
    assert "limits: rpm 60, weight 0.5, top-priority batch\n" in out
    assert _limits_of(state[1], "plain") == KeyLimits(rpm=60, weight=0.5, top_priority="batch")
    # Another limit's change leaves them as they are; giving the defaults back hides them again.
    llmgw(capsys, "key", "limit", "ops", *state, "--tpm", "500")
    assert _limits_of(state[1], "ops") == KeyLimits(tpm=500, weight=2.5, top_priority="critical")
    out = llmgw(
        capsys, "key", "limit", "ops", *state, "--weight", "1", "--top-priority", "interactive"
    )
    assert "limits: tpm 500\n" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--weight", "0"], "argument --weight: '0' is not above 0 and at most 1000"),
        (["--weight", "-2"], "argument --weight: '-2' is not above 0"),
        (["--weight", "1000.5"], "argument --weight: '1000.5' is not above 0 and at most 1000"),
        (["--weight", "nan"], "argument --weight: 'nan' is not above 0"),
        (["--weight", "inf"], "argument --weight: 'inf' is not above 0"),
        (["--weight", "heavy"], "argument --weight: 'heavy' is not a number"),
        (["--top-priority", "urgent"], "argument --top-priority: invalid choice: 'urgent'"),
        (["--top-priority", "Critical"], "argument --top-priority: invalid choice"),
    ],
)
def test_a_bad_weight_or_class_names_its_flag_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], state: list[str], argv: list[str], message: str
) -> None:
    llmgw(capsys, "key", "create", "svc", *state, "--weight", "3", "--top-priority", "batch")
    assert message in refused(capsys, "key", "limit", "svc", *state, *argv)
    assert _limits_of(state[1], "svc") == KeyLimits(weight=3, top_priority="batch")
    assert message in refused(capsys, "key", "create", "other", *state, *argv)
    assert [line.split()[0] for line in llmgw(capsys, "key", "list", *state).splitlines()] == [
        "NAME",
        "svc",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["key", "create", "bad name!"], "invalid key name"),
        (["key", "create", "k", "--rpm", "0"], "not at least 1"),
        (["key", "create", "k", "--tpm", "lots"], "not a whole number"),
        (["key", "create", "k", "--budget-period", "month"], "--budget-period needs --budget"),
        (["key", "create", "k", "--models", "a,\x1b[2J"], "invalid model"),
        (["key", "limit", "nobody", "--rpm", "5"], "no active key 'nobody'"),
        (["key", "revoke", "nobody"], "no active key 'nobody'"),
        (["usage", "--key", "nobody"], "no key 'nobody'"),
        (["usage", "--since", "May 1st"], "not a day as YYYY-MM-DD"),
        (["store", "migrate", "--to", "mysql://x"], "unsupported database URL"),
    ],
)
def test_mistakes_end_with_a_reason(
    capsys: pytest.CaptureFixture[str], state: list[str], argv: list[str], message: str
) -> None:
    assert message in refused(capsys, *argv, *state)


def test_limit_with_nothing_to_change_says_so(
    capsys: pytest.CaptureFixture[str], state: list[str]
) -> None:
    llmgw(capsys, "key", "create", "svc", *state)
    assert "nothing to change" in refused(capsys, "key", "limit", "svc", *state)


def test_a_revoked_key_lists_as_revoked(
    capsys: pytest.CaptureFixture[str], state: list[str]
) -> None:
    llmgw(capsys, "key", "create", "old", *state)
    assert "revoked old" in llmgw(capsys, "key", "revoke", "old", *state)
    assert llmgw(capsys, "key", "list", *state).splitlines()[1].endswith("revoked")


def test_usage_by_key_model_and_period_as_table_and_csv(
    capsys: pytest.CaptureFixture[str], state: list[str], tmp_path: Path
) -> None:
    llmgw(capsys, "key", "create", "ci", *state)
    (key,) = _dump(None, tmp_path).keys
    _add_usage(
        tmp_path,
        [
            UsageDelta(
                key_id=key.key_id,
                model=model,
                day=date(2025, 5, day),
                requests=1,
                prompt_tokens=100,
                completion_tokens=day,
            )
            for day in (1, 2, 3)
            for model in ("llama", "@evil")
        ],
    )
    table = llmgw(
        capsys, "usage", *state, "--key", "ci", "--model", "llama",
        "--since", "2025-05-02", "--until", "2025-05-02",
    ).splitlines()  # fmt: skip
    assert table[0].split() == [
        "DAY", "KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL"
    ]  # fmt: skip
    assert table[1].split() == ["2025-05-02", "ci", "llama", "1", "100", "2", "102"]
    assert len(table) == 2

    rows = list(csv.reader(io.StringIO(llmgw(capsys, "usage", *state, "--csv"))))
    assert len(rows) == 7
    assert {r[3] for r in rows[1:]} == {"llama", "'@evil"}
    assert {(r[1], r[2]) for r in rows[1:]} == {(key.key_id, "ci")}


def test_migrate_to_postgres_and_back_copies_everything(
    capsys: pytest.CaptureFixture[str], state: list[str], tmp_path: Path, postgres_url: str
) -> None:
    llmgw(capsys, "key", "create", "ci", *state, "--rpm", "7", "--adapters", "lora-a")
    llmgw(capsys, "key", "create", "gone", *state)
    llmgw(capsys, "key", "revoke", "gone", *state)
    keys = _dump(None, tmp_path).keys
    _add_usage(tmp_path, [UsageDelta(key_id=keys[0].key_id, model="m", day=date(2025, 1, 2))])

    async def engines_master() -> bytes:
        store = open_store(None, tmp_path)
        await store.init()
        secret = await store.master_secret()
        await store.close()
        return secret

    master = asyncio.run(engines_master())
    source = _dump(None, tmp_path)

    out = llmgw(capsys, "store", "migrate", *state, "--to", postgres_url)
    assert re.search(r"keys\s+2", out)
    assert re.search(r"usage rows\s+1", out)
    assert "engine master secret included" in out
    assert "every row matches" in out
    copied = _dump(postgres_url, tmp_path)
    assert copied == source
    assert copied.secrets["engine_master"] == master

    again = refused(capsys, "store", "migrate", *state, "--to", postgres_url)
    assert "already holds 2 key(s) and 1 usage row(s)" in again
    assert "--force" in again
    assert "every row matches" in llmgw(
        capsys, "store", "migrate", *state, "--to", postgres_url, "--force"
    )

    back_dir = tmp_path / "back"
    llmgw(
        capsys, "store", "migrate", "--database-url", postgres_url,
        "--state-dir", str(back_dir), "--to", f"sqlite:///{back_dir / 'copy.db'}",
    )  # fmt: skip
    assert _dump(f"sqlite:///{back_dir / 'copy.db'}", back_dir) == source


def test_migrate_to_an_unreachable_server_says_which(
    capsys: pytest.CaptureFixture[str], state: list[str]
) -> None:
    message = refused(
        capsys, "store", "migrate", *state, "--to", "postgresql://u:hunter2@127.0.0.1:1/x"
    )
    assert "cannot open the target store postgresql://u:***@127.0.0.1:1/x" in message
    assert "hunter2" not in message
