"""Garbage-collection planning, from plain data."""

import pytest

from activities.control.mirror.errors import MirrorError
from activities.control.mirror.gc import Seen, plan_gc

A, B, C, M1, M2 = (f"sha256:{c * 64}" for c in "abc12")


def test_keeps_what_a_ref_reaches_and_removes_the_rest() -> None:
    seen = Seen(
        refs={"kept": M1},
        manifests={M1: [A, B], M2: [B, C]},
        blobs={A: 10, B: 20, C: 30},
        manifest_sizes={M1: 1, M2: 2},
        tmp={"old.partial": (90_000.0, 5), "fresh.partial": (10.0, 7)},
    )
    plan = plan_gc(seen, tmp_max_age_s=86_400)
    assert plan.manifests == [M2]
    assert plan.blobs == [C]  # B is shared with the kept manifest
    assert plan.partials == ["old.partial"]
    assert plan.freed == 30 + 2 + 5
    assert plan.dangling == []


def test_dangling_ref_is_reported_and_an_unreadable_kept_manifest_stops_gc() -> None:
    plan = plan_gc(Seen(refs={"gone": M1}, manifests={}, blobs={A: 1}), 0)
    assert plan.dangling == ["gone"]
    assert plan.blobs == [A]
    with pytest.raises(MirrorError, match="removes nothing"):
        plan_gc(Seen(refs={"x": M1}, manifests={M1: None}, blobs={A: 1}), 0)
