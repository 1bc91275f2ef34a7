"""Why a replica could not be placed, in a few hundred bytes whatever the fleet's size.

place() gives one reason per node. At 1,000 nodes that is about 88 KB, and a replica waiting
for room asks every 30 s: every answer lands in the ledger's and the replica's histories, and
the replica's route (which every gateway reads) shows it. So the answer is summarised here:
nodes with the same reason are counted together ("node is cordoned: 3 nodes"), reasons that
differ only in their numbers are one group with each number shown as the range it spans
("0-2 of 8 h100-80g free, 4 wanted: 812 nodes"), a reason only one node gives names it as
before ("n1: llamacpp installing"), the biggest groups come first, and the whole is capped.
`llmgw model why` still lists every node, from a query that writes no history.

Pure: the ledger runs it inside the workflow sandbox, and replays it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from workflows.placement.place import CLUSTER

# The error type of a refusal raised rather than answered, by the ledger workflow of before
# December 2026: a replica's history from then may still hold one.
NO_PLACEMENT = "NoPlacement"
# A route detail and an update result, not a document: small next to the 2 MB a gateway's
# whole table must fit in, and enough for the three or four reasons that matter.
MAX_SUMMARY = 512
# One group's reason is cut to this, so one long note cannot crowd out every other reason.
MAX_REASON = 160
MORE_HINT = "`llmgw model why` lists every node"

# Whole numbers standing alone: "0 of 8 CPU cores free" varies, "h100-80g" and "3g.40gb" do not.
_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")


@dataclass
class _Group:
    texts: list[str]  # the reason's words around its numbers
    numbers: list[list[int]] = field(default_factory=list)  # each number's values seen
    nodes: list[str] = field(default_factory=list)

    def reason(self) -> str:
        parts = [self.texts[0]]
        for values, text in zip(self.numbers, self.texts[1:], strict=True):
            low, high = min(values), max(values)
            parts.append(f"{low}" if low == high else f"{low}-{high}")
            parts.append(text)
        return _cut("".join(parts), MAX_REASON)

    def line(self) -> str:
        if len(self.nodes) == 1:
            return f"{self.nodes[0]}: {self.reason()}"
        return f"{self.reason()}: {len(self.nodes)} nodes"


def summarise_refusal(reasons: Mapping[str, str], limit: int = MAX_SUMMARY) -> str:
    """Every node's reason grouped, counted, biggest group first, at most `limit` characters.

    The cluster-wide reason (placement's CLUSTER key: no nodes at all, no fabric wide enough)
    comes first: it is the one that explains the rest."""
    groups: dict[tuple[str, ...], _Group] = {}
    for node, reason in sorted(reasons.items()):
        if node == CLUSTER:
            continue
        one_line = " ".join(reason.split())
        texts = tuple(_NUMBER.split(one_line))
        numbers = [int(n) for n in _NUMBER.findall(one_line)]
        group = groups.setdefault(texts, _Group(texts=list(texts), numbers=[[] for _ in numbers]))
        for seen, value in zip(group.numbers, numbers, strict=True):
            seen.append(value)
        group.nodes.append(node)
    lines = []
    if CLUSTER in reasons:
        lines.append(f"{CLUSTER}: {_cut(' '.join(reasons[CLUSTER].split()), MAX_REASON)}")
    ordered = sorted(groups.values(), key=lambda g: (-len(g.nodes), g.reason()))
    lines += [g.line() for g in ordered]
    return _join_capped(lines, limit)


def _join_capped(lines: list[str], limit: int) -> str:
    """As many whole lines as fit, then how many were left out."""
    kept: list[str] = []
    for index, line in enumerate(lines):
        after = len(lines) - index - 1
        if len("; ".join([*kept, line]) + _more(after)) <= limit:
            kept.append(line)
            continue
        if kept:
            # The last pass checked that these lines and this tail fit.
            return "; ".join(kept) + _more(after + 1)
        tail = _more(after)
        return _cut(line, limit - len(tail)) + tail
    return "; ".join(kept)


def _more(left: int) -> str:
    return f"; and {left} more reason{'s' * (left > 1)} ({MORE_HINT})" if left else ""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
