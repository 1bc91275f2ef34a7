"""The GPU check's step runner and table (bench/gpu_check/runner.py): timeouts, a failure that
hides nothing after it, skips that say the first reason, the budget, the exit status."""

from __future__ import annotations

import asyncio

import pytest

from bench.gpu_check.runner import (
    Budget,
    Failed,
    Outcome,
    Skip,
    Step,
    StepResult,
    exit_status,
    run_steps,
    table,
)


def step(name: str, answer: object, timeout_s: float = 5.0, needs: tuple[str, ...] = ()) -> Step:
    """A step that returns `answer` (a str), raises it (an exception), or sleeps (a float)."""

    async def run() -> str:
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, float):
            await asyncio.sleep(answer)
            return "slept"
        assert isinstance(answer, str)
        return answer

    return Step(name, run, timeout_s, needs)


def outcomes(results: list[StepResult]) -> dict[str, tuple[Outcome, str]]:
    return {r.name: (r.outcome, r.detail) for r in results}


async def test_a_failed_or_timed_out_step_hides_no_later_independent_step() -> None:
    seen: list[str] = []
    results = await run_steps(
        [
            step("discovery", "1 x NVIDIA H100"),
            step("doctor", Failed("doctor printed no JSON")),
            step("slow", 10.0, timeout_s=0.05),
            step("broken", KeyError("inventory")),
            step("nvml", "agrees", needs=("discovery",)),
        ],
        Budget(60),
        lambda r: seen.append(r.name),
    )
    found = outcomes(results)
    assert found["discovery"] == (Outcome.PASS, "1 x NVIDIA H100")
    assert found["doctor"] == (Outcome.FAIL, "doctor printed no JSON")
    assert found["slow"] == (Outcome.FAIL, "timed out after 0s (its timeout)")
    assert found["broken"] == (Outcome.FAIL, "KeyError: 'inventory'")
    assert found["nvml"] == (Outcome.PASS, "agrees")
    assert seen == ["discovery", "doctor", "slow", "broken", "nvml"]  # reported as they end
    assert results[2].seconds < 1.0  # cut at its timeout, not slept out


async def test_a_step_whose_prerequisite_failed_is_skipped_and_says_which() -> None:
    results = await run_steps(
        [
            step("vllm-install", RuntimeError("pip exited 1")),
            step("serve", "served", needs=("vllm-install",)),
            step("kv-blocks", "cached", needs=("serve",)),
        ],
        Budget(60),
    )
    found = outcomes(results)
    assert found["serve"] == (Outcome.SKIP, "needs vllm-install, which failed")
    # The first reason, not "needs serve": the operator looks at vllm-install.
    assert found["kv-blocks"] == (Outcome.SKIP, "needs vllm-install, which failed")
    assert exit_status(results) == 1


async def test_a_skip_carries_its_first_reason_down_the_chain() -> None:
    results = await run_steps(
        [
            step("vllm-install", Skip("no NVIDIA GPU on this machine")),
            step("model-unpack", "unpacked", needs=("vllm-install",)),
            step("serve", "served", needs=("model-unpack",)),
            step("nowhere", "x", needs=("never-defined",)),
        ],
        Budget(60),
    )
    found = outcomes(results)
    assert found["vllm-install"] == (Outcome.SKIP, "no NVIDIA GPU on this machine")
    assert found["model-unpack"] == (Outcome.SKIP, "no NVIDIA GPU on this machine")
    assert found["serve"] == (Outcome.SKIP, "no NVIDIA GPU on this machine")
    assert found["nowhere"] == (Outcome.SKIP, "needs never-defined, which did not run")
    assert exit_status(results) == 0  # skips are not failures


async def test_the_budget_cuts_a_step_short_and_then_fails_the_rest() -> None:
    now = [0.0]
    budget = Budget(1.0, clock=lambda: now[0])

    async def late() -> str:
        await asyncio.sleep(10)
        return "never"

    now[0] = 0.95  # 50 ms of the budget left for a step allowed 5 s
    (cut,) = await run_steps([Step("serve", late, 5.0)], budget)
    assert (cut.outcome, cut.detail) == (Outcome.FAIL, "timed out after 0s (the check's budget)")
    now[0] = 2.0
    (none,) = await run_steps([step("kv-blocks", "x")], budget)
    assert (none.outcome, none.detail) == (Outcome.FAIL, "no time left in the check's budget")


async def test_a_helper_that_stops_with_system_exit_is_a_failure_with_its_message() -> None:
    (result,) = await run_steps(
        [step("vllm-install", SystemExit("vllm 0.32.0 is not usable"))], Budget(5)
    )
    assert (result.outcome, result.detail) == (Outcome.FAIL, "vllm 0.32.0 is not usable")


@pytest.mark.parametrize(
    ("outcomes_", "status"),
    [
        ((Outcome.PASS, Outcome.SKIP), 0),
        ((Outcome.PASS, Outcome.FAIL, Outcome.SKIP), 1),
        ((), 0),
    ],
)
def test_exit_status_is_one_only_for_a_failure(outcomes_: tuple[Outcome, ...], status: int) -> None:
    results = [StepResult(f"s{i}", o, 0.0, "") for i, o in enumerate(outcomes_)]
    assert exit_status(results) == status


def test_the_table_has_a_line_per_step_and_cuts_long_details() -> None:
    results = [
        StepResult("discovery", Outcome.PASS, 0.12, "1 x NVIDIA H100 80GB HBM3,\ndriver 570"),
        StepResult("kv-blocks", Outcome.FAIL, 61.0, "x" * 200),
        StepResult("serve", Outcome.SKIP, 0.0, "no NVIDIA GPU"),
    ]
    lines = table(results, detail_width=40).splitlines()
    assert lines[0].split() == ["step", "result", "seconds", "detail"]
    assert lines[1].split(None, 3) == [
        "discovery",
        "PASS",
        "0.1",
        "1 x NVIDIA H100 80GB HBM3, driver 570",
    ]
    assert lines[2].split(None, 3)[:3] == ["kv-blocks", "FAIL", "61.0"]
    assert lines[2].endswith("x" * 37 + "...")
    assert lines[3].split(None, 3) == ["serve", "SKIP", "0.0", "no NVIDIA GPU"]
    assert lines[4] == "1 pass, 1 fail, 1 skip"
    # The columns line up: every result starts where the header's does.
    assert {
        line.index(word) for line, word in zip(lines[1:4], ("PASS", "FAIL", "SKIP"), strict=True)
    } == {lines[0].index("result")}
