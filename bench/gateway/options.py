"""The gateway benchmark's arms, options and command line (bench/gateway/main.py runs them)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from bench.gateway import paired
from bench.gateway.target import LOOPS

# llmgw-otel: llmgw tracing every request to an OTLP receiver (bench/gateway/otlp_sink.py) on
# the load generator's core, so the figures beside llmgw's are what tracing costs.
ARMS = ("direct", "hop", "llmgw", "llmgw-otel", "litellm", "vllm-router")


@dataclass(frozen=True)
class Options:
    arms: tuple[str, ...]
    duration_s: float
    warmup_s: float
    chunks: int
    gateway_loop: str
    workdir: Path
    # The scale-out figures (bench/gateway/scale.py) after the arms.
    scale_out: bool = True
    # The LiteLLM and vLLM router executables, or why there is none.
    litellm: Path | str = "not installed"
    vllm_router: Path | str = "not installed"
    # The store the quota figures' two gateways share: "" for a SQLite file.
    quota_store: str = ""
    # The large-prompt figures (bench/gateway/large.py) of the arms in large.ARMS.
    large_prompts: bool = True
    # Rounds of hop and llmgw measured in turn and together (bench/gateway/paired.py); 0: none.
    paired_rounds: int = paired.ROUNDS

    @property
    def paired_arms(self) -> bool:
        return all(arm in self.arms for arm in paired.ARMS)


def _arms(text: str) -> tuple[str, ...]:
    chosen = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in chosen if a not in ARMS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose among {','.join(ARMS)}")
    # Always in the table's order, so ratios read the same way in every run.
    return tuple(a for a in ARMS if a in chosen)


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only",
        type=_arms,
        default=ARMS,
        metavar="ARMS",
        help=f"comma-separated arms to run (default: {','.join(ARMS)})",
    )
    parser.add_argument(
        "--duration", type=_seconds, default=5.0, help="seconds measured per figure (default 5)"
    )
    parser.add_argument(
        "--warmup", type=_seconds, default=1.0, help="seconds of warm-up per figure (default 1)"
    )
    parser.add_argument(
        "--chunks", type=int, default=16, help="content chunks per SSE stream (default 16)"
    )
    parser.add_argument(
        "--gateway-loop",
        choices=LOOPS,
        default="uvicorn",
        help="the gateway's event loop: uvicorn's choice (uvloop) or plain asyncio",
    )
    parser.add_argument("--markdown", type=Path, help="also write the table here (Markdown)")
    parser.add_argument("--json", dest="json_out", type=Path, help="also write figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--quota-store",
        default="",
        metavar="URL",
        help="the quota figures' shared store, postgresql://... (default: a SQLite file)",
    )
    parser.add_argument(
        "--no-large",
        action="store_true",
        help="skip the large-prompt figures (200 KB bodies, small requests beside them)",
    )
    parser.add_argument(
        "--paired-rounds",
        type=int,
        default=paired.ROUNDS,
        metavar="N",
        help="rounds of hop and llmgw measured in turn and together, for the CPU ratio "
        f"(default {paired.ROUNDS}; 0 skips them)",
    )
    parser.add_argument(
        "--no-scale",
        action="store_true",
        help="skip the scale-out figures (one worker vs two, quota with two gateways)",
    )
