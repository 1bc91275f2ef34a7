"""A subscriber's place in one publisher's sequence: in order, a gap to replay, a restart."""

import pytest

from kv.sequence import SequenceTracker, Verdict


def test_the_first_batch_starts_an_empty_index_then_batches_apply_in_order() -> None:
    tracker = SequenceTracker()
    assert tracker.see(41) is Verdict.RESTART  # joined late: what came before is unknown
    assert [tracker.see(n) for n in (42, 43)] == [Verdict.APPLY, Verdict.APPLY]


def test_a_batch_seen_twice_is_not_applied_twice() -> None:
    tracker = SequenceTracker()
    for n in (0, 1, 2):
        tracker.see(n)
    assert tracker.see(1) is Verdict.DUPLICATE
    assert tracker.see(3) is Verdict.APPLY


def test_a_gap_names_the_batches_a_replay_must_bring() -> None:
    tracker = SequenceTracker()
    tracker.see(0)
    assert tracker.see(5) is Verdict.GAP
    assert (tracker.missing_from, tracker.missing_until) == (1, 5)
    assert [n for n in range(0, 8) if tracker.missed(n)] == [1, 2, 3, 4]
    assert tracker.replayed_from(1)
    tracker.gap_closed()
    assert not tracker.missed(2)
    assert tracker.see(6) is Verdict.APPLY


def test_a_replay_that_starts_past_the_gap_cannot_close_it() -> None:
    # The engine's buffer no longer holds batch 1: the index must be rebuilt from nothing.
    tracker = SequenceTracker()
    tracker.see(0)
    tracker.see(5)
    assert not tracker.replayed_from(3)


def test_a_publisher_that_restarts_begins_again_at_zero() -> None:
    tracker = SequenceTracker()
    for n in (0, 1, 2, 3):
        tracker.see(n)
    assert tracker.see(0) is Verdict.RESTART
    assert tracker.see(1) is Verdict.APPLY


def test_sequence_numbers_are_unsigned() -> None:
    with pytest.raises(ValueError, match="unsigned"):
        SequenceTracker().see(-1)
