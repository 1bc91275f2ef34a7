"""What the KV routing benchmark reports (pure): per arm and cache setting, TTFT, the engines'
cached share of prompt tokens (from each answer's usage), each figure against the oracle's of
the same setting and run, and for the precise arm how far the gateway's predictions of cached
tokens were from what the engines reported (from the gateway's own /metrics).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from bench.intervals import WorkloadSums, interval_text, mean_ratio_interval, workload_intervals

ARMS = ("precise", "approximate", "least_load", "oracle")
ORACLE = "oracle"


@dataclass
class Prediction:
    """The gateway's llmgw_kv_predicted_cached_tokens_error histogram and its totals."""

    predicted: float = 0.0
    reported: float = 0.0
    # Tokens predicted and not found, and found and not predicted, summed over requests.
    over: float = 0.0
    under: float = 0.0
    # upper bound of |error| for a bucket -> requests in it (the histogram's own buckets).
    by_bound: dict[float, float] = field(default_factory=dict)

    @property
    def requests(self) -> float:
        return sum(self.by_bound.values())

    @property
    def exact(self) -> float:
        return self.by_bound.get(0.0, 0.0)

    @property
    def abs_error_bound(self) -> float:
        """Sum over requests of each one's |predicted - reported|, at most: every request
        counted at its bucket's wider edge (exact for the bucket of 0)."""
        return sum(bound * count for bound, count in self.by_bound.items())

    def add(self, other: Prediction) -> None:
        self.predicted += other.predicted
        self.reported += other.reported
        self.over += other.over
        self.under += other.under
        for bound, count in other.by_bound.items():
            self.by_bound[bound] = self.by_bound.get(bound, 0.0) + count


def parse_prediction(metrics_text: str) -> Prediction:
    """The histogram out of a Prometheus text page: cumulative buckets turned into counts per
    bucket, each keyed by the largest |error| it can hold."""
    cumulative: list[tuple[float, float]] = []
    found = Prediction()
    for line in metrics_text.splitlines():
        if line.startswith("llmgw_kv_predicted_cached_tokens_error_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            cumulative.append((float(le), float(line.rsplit(" ", 1)[1])))
        elif line.startswith("llmgw_kv_cached_tokens_total{"):
            value = float(line.rsplit(" ", 1)[1])
            if 'kind="predicted"' in line:
                found.predicted += value
            elif 'kind="reported"' in line:
                found.reported += value
            elif 'kind="over"' in line:
                found.over += value
            elif 'kind="under"' in line:
                found.under += value
    cumulative.sort()
    below, previous_edge = 0.0, -math.inf
    for edge, count in cumulative:
        # Errors are whole tokens: the bucket (previous_edge, edge] holds values whose size is
        # at most max(|previous_edge|, |edge|); the one (-1, 0] holds only 0; +Inf past 4096
        # is counted at its lower edge, so the bound is not one there (none was seen).
        if math.isinf(edge):
            bound = abs(previous_edge)
        elif math.isinf(previous_edge):
            bound = abs(edge)
        else:
            bound = 0.0 if (previous_edge, edge) == (-1.0, 0.0) else max(abs(previous_edge), edge)
        if count - below:
            found.by_bound[bound] = found.by_bound.get(bound, 0.0) + count - below
        below, previous_edge = count, edge
    return found


@dataclass
class ArmResult:
    setting: str
    arm: str
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    errors: int = 0
    # workload's seed -> this arm's sums on it
    by_workload: dict[int, WorkloadSums] = field(default_factory=dict)
    reasons: dict[str, float] = field(default_factory=dict)
    # The gateway's asks of an engine's /tokenize (precise arm): their count and total time.
    tokenize_count: float = 0.0
    tokenize_s: float = 0.0
    prediction: Prediction = field(default_factory=Prediction)
    # With --restart: the restarted gateway's decisions by reason, all made after it came back.
    after_restart: dict[str, float] = field(default_factory=dict)
    # Decisions each gateway process made (several: --gateways, --workers), summed over runs.
    per_process: list[float] = field(default_factory=list)

    @property
    def blind_after_restart(self) -> tuple[float, float]:
        """(decisions the restarted gateway made cache-blind, all it made): blind is placing a
        prompt as a new prefix or by load alone, where every group's prefix had been sent
        before the restart (the restart comes after the workload's first round)."""
        blind = sum(self.after_restart.get(r, 0.0) for r in ("new_prefix", "least_load"))
        return blind, sum(self.after_restart.values())

    def add(self, workload: int, ttft_s: float, prompt_tokens: int, cached_tokens: int) -> None:
        """One answer, on the workload of seed `workload`."""
        self.ttft_s.append(ttft_s)
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self.by_workload.setdefault(workload, WorkloadSums()).add(
            ttft_s, cached_tokens, prompt_tokens
        )

    @property
    def mean_ms(self) -> float:
        return 1000 * statistics.fmean(self.ttft_s) if self.ttft_s else math.nan

    @property
    def p90_ms(self) -> float:
        if len(self.ttft_s) < 2:
            return self.mean_ms
        return 1000 * statistics.quantiles(self.ttft_s, n=10, method="inclusive")[-1]

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else math.nan

    @property
    def mean_prompt_tokens(self) -> float:
        return self.prompt_tokens / len(self.ttft_s) if self.ttft_s else math.nan

    @property
    def error_share(self) -> float:
        """Mean |predicted - reported| per KV-routed request, as a share of the arm's mean
        prompt length: exact from the gateway's over and under totals, else the histogram's
        upper bound (a gateway from before those totals); NaN for an arm without predictions."""
        pred = self.prediction
        if not pred.requests or not self.ttft_s:
            return math.nan
        wrong = pred.over + pred.under if pred.over or pred.under else pred.abs_error_bound
        return wrong / pred.requests / self.mean_prompt_tokens

    @property
    def net_error_share(self) -> float:
        """(predicted - reported) over every KV-routed request, as a share of their prompt
        tokens (taken at the arm's mean prompt length)."""
        pred = self.prediction
        if not pred.requests or not self.ttft_s:
            return math.nan
        return (pred.predicted - pred.reported) / (pred.requests * self.mean_prompt_tokens)


@dataclass(frozen=True)
class Ratios:
    mean: float
    p90: float
    cached: float
    # The 95% interval of `mean` from this run's own requests (bench/intervals.py).
    mean_low: float = math.nan
    mean_high: float = math.nan
    # The 95% intervals of `mean` and `cached` from whole workloads, each paired with the
    # oracle's on the same one; NaN with fewer than intervals.MIN_WORKLOADS of them.
    mean_paired_low: float = math.nan
    mean_paired_high: float = math.nan
    cached_low: float = math.nan
    cached_high: float = math.nan


def against_oracle(results: Sequence[ArmResult]) -> dict[tuple[str, str], Ratios]:
    """Each arm's mean and p90 TTFT and cached share divided by the oracle's in its setting
    (below 1 is faster for TTFT; above 1 is more cached)."""
    oracle = {r.setting: r for r in results if r.arm == ORACLE}
    out: dict[tuple[str, str], Ratios] = {}
    for r in results:
        base = oracle.get(r.setting)
        if base is None:
            out[(r.setting, r.arm)] = Ratios(math.nan, math.nan, math.nan)
            continue
        nothing = (math.nan, math.nan)
        is_base = r is base
        low, high = nothing if is_base else mean_ratio_interval(r.ttft_s, base.ttft_s)
        means, cached = (
            (nothing, nothing) if is_base else workload_intervals(r.by_workload, base.by_workload)
        )
        out[(r.setting, r.arm)] = Ratios(
            _ratio(r.mean_ms, base.mean_ms),
            _ratio(r.p90_ms, base.p90_ms),
            _ratio(r.cached_share, base.cached_share),
            low,
            high,
            *means,
            *cached,
        )
    return out


def _ratio(value: float, base: float) -> float:
    return value / base if base and not math.isnan(base) else math.nan


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1%}"


def _num(value: float, fmt: str) -> str:
    return "-" if math.isnan(value) else format(value, fmt)


HEADERS = (
    "setting",
    "arm",
    "n",
    "err",
    "mean TTFT ms",
    "p90 TTFT ms",
    "cached",
    "mean/oracle",
    "95%: requests",
    "95%: workloads",
    "p90/oracle",
    "cached/oracle",
    "95%: workloads",
    "pred. error",
)


def rows(results: Sequence[ArmResult]) -> list[list[str]]:
    ratios = against_oracle(results)
    out = []
    for r in results:
        ratio = ratios[(r.setting, r.arm)]
        out.append(
            [
                r.setting,
                r.arm,
                str(len(r.ttft_s)),
                str(r.errors),
                _num(r.mean_ms, ".0f"),
                _num(r.p90_ms, ".0f"),
                _pct(r.cached_share),
                _num(ratio.mean, ".3f"),
                interval_text(ratio.mean_low, ratio.mean_high),
                interval_text(ratio.mean_paired_low, ratio.mean_paired_high),
                _num(ratio.p90, ".3f"),
                _num(ratio.cached, ".3f"),
                interval_text(ratio.cached_low, ratio.cached_high),
                _pct(r.error_share),
            ]
        )
    return out


def _decisions(results: Sequence[ArmResult]) -> list[str]:
    lines = []
    for r in results:
        counts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.reasons.items()) if v)
        line = f"gateway decisions ({r.setting}, {r.arm}): {counts or 'none'}"
        if len(r.per_process) > 1:
            line += "; decisions per gateway process " + "/".join(f"{n:.0f}" for n in r.per_process)
        blind, after = r.blind_after_restart
        if after:
            line += f"; after its restart one gateway made {blind:.0f} of {after:.0f} cache-blind"
        if r.tokenize_count:
            line += f"; /tokenize took {1000 * r.tokenize_s / r.tokenize_count:.0f} ms on average"
        pred = r.prediction
        if pred.requests:
            line += (
                f"; {pred.requests:.0f} KV-routed, {pred.exact:.0f} predicted exactly, "
                f"cached tokens predicted {pred.predicted:.0f} / reported {pred.reported:.0f} "
                f"(net {_pct(r.net_error_share)} of prompt tokens; {pred.over:.0f} predicted "
                f"and not found, {pred.under:.0f} found and not predicted)"
            )
        lines.append(line)
    return lines


def table(results: Sequence[ArmResult]) -> str:
    body = [list(HEADERS), *rows(results)]
    widths = [max(len(row[i]) for row in body) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in body]
    return "\n".join([*lines, *_decisions(results)])


def markdown(results: Sequence[ArmResult], header: str) -> str:
    lines = [header, "", "| " + " | ".join(HEADERS) + " |"]
    lines.append("|" + "|".join("---" for _ in HEADERS) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    lines += ["", *(f"- {line}" for line in _decisions(results))]
    return "\n".join(lines) + "\n"


def as_json(results: Sequence[ArmResult], config: Mapping[str, object]) -> str:
    ratios = against_oracle(results)
    arms = []
    for r in results:
        ratio = ratios[(r.setting, r.arm)]
        raw = asdict(r)
        raw["prediction"]["by_bound"] = {str(k): v for k, v in r.prediction.by_bound.items()}
        raw.update(
            mean_ms=r.mean_ms,
            p90_ms=r.p90_ms,
            cached_share=r.cached_share,
            error_share=r.error_share,
            net_error_share=r.net_error_share,
            mean_vs_oracle=ratio.mean,
            mean_vs_oracle_interval=[ratio.mean_low, ratio.mean_high],
            mean_vs_oracle_workload_interval=[ratio.mean_paired_low, ratio.mean_paired_high],
            p90_vs_oracle=ratio.p90,
            cached_vs_oracle=ratio.cached,
            cached_vs_oracle_workload_interval=[ratio.cached_low, ratio.cached_high],
        )
        arms.append(raw)
    return json.dumps({"config": dict(config), "arms": arms}, indent=2, default=str)
