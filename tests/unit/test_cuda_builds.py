"""The CUDA an engine version's builds need, worked out from its row's list."""

from workflows.contracts.cuda_builds import (
    CudaBuild,
    build_for,
    cuda_shortfall,
    version_key,
)

BUILDS = (
    CudaBuild(since="0", cuda_major=12, min_compute_capability="7.0"),
    CudaBuild(since="0.20.0", cuda_major=13, min_compute_capability="7.5"),
)


def test_versions_order_by_their_numbers_not_their_text() -> None:
    assert version_key("0.5.10.post1") == (0, 5, 10)
    assert version_key("0.20.1-1") == (0, 20, 1)
    assert version_key("0.5.2rc0") == (0, 5, 2)
    assert version_key("main") == ()
    assert version_key("0.9.2") < version_key("0.10.0") < version_key("0.20.0")


def test_each_version_gets_the_builds_it_falls_in() -> None:
    assert build_for(BUILDS, "0.19.1") == BUILDS[0]
    assert build_for(BUILDS, "0.20.0") == BUILDS[1]
    assert build_for(BUILDS, "0.34.0") == BUILDS[1]
    assert build_for(BUILDS, "nightly") is None
    assert build_for((), "1.0") is None


def test_a_driver_or_gpus_too_old_fall_short_and_unknowns_do_not() -> None:
    def short(version: str, cuda: str | None, caps: list[str]) -> str:
        found = cuda_shortfall("vLLM", version, BUILDS, "550.54.15", cuda, caps)
        return found.message if found else ""

    assert short("0.32.0", "12.4", ["9.0"]).startswith("vLLM 0.32.0 needs a driver for CUDA 13")
    assert short("0.19.1", "12.4", ["9.0"]) == ""
    assert short("0.32.0", None, ["9.0"]) == ""  # the driver's CUDA was not read
    assert "compute capability 7.5" in short("0.32.0", "13.0", ["7.0", "6.1"])
    assert short("0.32.0", "13.0", ["7.0", "8.0"]) == ""  # one GPU can run it
    assert short("0.32.0", "13.0", ["7.0", ""]) == ""  # one not read: not held against it
    # An unnumbered version is judged by the oldest builds.
    assert short("nightly", "11.8", []).startswith("vLLM nightly needs a driver for CUDA 12")
