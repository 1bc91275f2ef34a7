"""Where a KV-event subscriber stands in one publisher's sequence: in order, behind a gap it can
ask the replay socket to fill, or facing a publisher that restarted (its sequence starts at 0
again, and every block it reported before is gone with its process).

Pure: numbers in, a verdict out. The subscriber acts on the verdict: apply; on a gap, hold the
batch, ask for a replay from `missing_from`, apply the replayed batches below the held one in
order, then the held one (order matters: a block stored in a missed batch may be removed in the
held one); on a restart, or a replay that cannot close the gap, drop that replica's index and
start over."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Verdict(Enum):
    APPLY = "apply"  # the next batch in order
    DUPLICATE = "duplicate"  # already applied (a replay overlapping the live stream)
    GAP = "gap"  # batches were missed: replay from missing_from, then apply this one
    RESTART = "restart"  # the publisher started over: reset the index, then apply this one


@dataclass
class SequenceTracker:
    # The next sequence number expected; None before the first batch.
    expected: int | None = None
    # Set by a GAP verdict: the missed numbers are missing_from <= seq < missing_until.
    missing_from: int | None = None
    missing_until: int | None = None

    def see(self, seq: int) -> Verdict:
        if seq < 0:
            raise ValueError(f"a sequence number is unsigned, not {seq}")
        if self.expected is None:
            # The first batch heard: whatever came before is unknown, so the index starts
            # empty. A publisher that restarted is at 0, one joined late is further on.
            return self._accept(seq, Verdict.RESTART)
        if seq == self.expected:
            return self._accept(seq, Verdict.APPLY)
        if seq == 0:
            # vLLM restarts its sequence at 0 with each publisher process.
            return self._accept(seq, Verdict.RESTART)
        if seq < self.expected:
            return Verdict.DUPLICATE
        self.missing_from, self.missing_until = self.expected, seq
        return self._accept(seq, Verdict.GAP)

    def replayed_from(self, first_seq: int) -> bool:
        """Whether a replay that begins at `first_seq` closes the gap. It does not when the
        engine's buffer no longer holds the first missing batch: the loss is permanent and the
        index must be rebuilt from nothing."""
        return self.missing_from is None or first_seq <= self.missing_from

    def missed(self, seq: int) -> bool:
        """Whether a replayed batch is one the gap lost (the others were applied already)."""
        if self.missing_from is None or self.missing_until is None:
            return False
        return self.missing_from <= seq < self.missing_until

    def gap_closed(self) -> None:
        self.missing_from = self.missing_until = None

    def _accept(self, seq: int, verdict: Verdict) -> Verdict:
        self.expected = seq + 1
        return verdict
