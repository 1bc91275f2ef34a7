"""The free disk an agent reports where it keeps fetched artifacts: read with statvfs where the
store is (or its nearest existing parent, before the first fetch), rounded down so that the
inventory is not published again for every megabyte written, and None when it cannot be read."""

import os
import shutil
from pathlib import Path

import pytest

from activities.agent.artifact_store import ArtifactStore, two_figures

MB = 1_000_000


def free_mb(path: Path) -> int:
    return shutil.disk_usage(path).free // MB


@pytest.mark.parametrize("root", ["artifacts", "state/not/made/yet/artifacts"])
def test_the_free_space_of_the_stores_file_system_is_reported(tmp_path: Path, root: str) -> None:
    store = ArtifactStore(tmp_path / root)
    if root == "artifacts":
        store.prepare()
    before = free_mb(tmp_path)
    reported = store.disk_free_mb()
    after = free_mb(tmp_path)
    assert reported is not None
    # Other programs write to this disk meanwhile: the answer lies between the two readings,
    # rounded down, and never above the truth.
    assert two_figures(min(before, after)) <= reported <= max(before, after)
    assert reported > 0


def test_a_disk_that_cannot_be_read_is_not_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(_path: object) -> os.statvfs_result:
        raise PermissionError("statvfs refused")

    monkeypatch.setattr(os, "statvfs", refuse)
    assert ArtifactStore(tmp_path / "artifacts").disk_free_mb() is None


def test_free_space_is_rounded_down_to_two_significant_figures() -> None:
    assert [two_figures(v) for v in (0, 7, 42, 409, 1234, 98765, 1_999_999)] == [
        0, 7, 42, 400, 1200, 98000, 1_900_000,
    ]  # fmt: skip
