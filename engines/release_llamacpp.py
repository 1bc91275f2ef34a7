"""llama.cpp's official release archives: which one fits this node, fetched and checked.

Names follow llama.cpp's `.github/workflows/release.yml`: `llama-<tag>-bin-ubuntu-<arch>.tar.gz`
for the CPU build (x64, arm64, s390x), `-ubuntu-vulkan-<arch>`, `-ubuntu-rocm-7.2-x64`, and
Windows zips. There is no Linux CUDA archive (CUDA builds are published for Windows only), so a
node with an NVIDIA driver builds from source with CUDA unless the operator names an archive of
their own (`asset:`) in the mirror. Each archive unpacks to `llama-<tag>/` holding llama-server
and its shared libraries (rpath $ORIGIN).

An archive is used only after its sha256 matched the published one: from the config, else from
`<archive>.sha256` beside it in the mirror (GitHub's release API publishes `digest:
"sha256:<hex>"` per asset; a mirror keeps it in that file). No digest, no install.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from engines.build_llamacpp import BINARY, Progress
from engines.safe_extract import UnsafeArchiveError, safe_extract
from workflows.contracts import EngineRequirement

GITHUB_RELEASES = "https://github.com/ggml-org/llama.cpp/releases/download"
FETCH_TIMEOUT_S = 60.0
_CHUNK = 1 << 20
_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64", "s390x": "s390x"}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ASSET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


class ArchiveUnavailableError(RuntimeError):
    """No archive could be fetched (no asset for this node, network, 404): build instead."""


class ArchiveRejectedError(RuntimeError):
    """The archive was fetched and must not be used (digest mismatch, no digest, unsafe)."""


def release_tag(version: str) -> str:
    """`b11434` as it is, `11434.0.0` (the PyPI source package's number) as `b11434`."""
    if version.startswith("b"):
        return version
    return "b" + version.split(".", 1)[0]


def asset_name(tag: str, machine: str, nvidia: bool) -> str | None:
    """The official archive for this node, or None where llama.cpp publishes none."""
    arch = _ARCH.get(machine.lower())
    if arch is None or nvidia:
        return None
    return f"llama-{tag}-bin-ubuntu-{arch}.tar.gz"


def _open(url: str) -> Any:  # an http.client.HTTPResponse (or a file-like for other schemes)
    if not url.startswith(("https://", "http://")):
        raise ArchiveUnavailableError(f"not an http(s) URL: {url}")
    return urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S)  # noqa: S310 (scheme checked)


def published_digest(req: EngineRequirement, name: str, url: str) -> str:
    configured = req.sha256.get(name)
    if configured:
        return configured.removeprefix("sha256:").lower()
    try:
        with _open(url + ".sha256") as response:
            text = response.read(4096).decode("ascii", "replace")
    except (urllib.error.URLError, OSError) as err:
        raise ArchiveRejectedError(
            f"no published sha256 for {name}: none configured and {url}.sha256 unreadable ({err})"
        ) from err
    # `sha256sum` writes "<hex>  <name>"; GitHub's API form is "sha256:<hex>".
    token = text.split()[0].removeprefix("sha256:").lower() if text.split() else ""
    if not _HEX64.match(token):
        raise ArchiveRejectedError(f"{url}.sha256 does not hold a sha256: {text[:80]!r}")
    return token


def _human(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 1_000_000 else f"{max(1, size // 1000)} kB"


def _download(url: str, name: str, destination: Path, progress: Progress) -> str:
    """Stream to a temporary file beside `destination`; returns the sha256 of what arrived."""
    digest = hashlib.sha256()
    try:
        response = _open(url)
    except (urllib.error.URLError, OSError) as err:
        raise ArchiveUnavailableError(f"cannot fetch {url}: {err}") from err
    with response:
        size = int(response.headers.get("Content-Length") or 0)
        label = f"downloading {name} ({_human(size)})" if size else f"downloading {name}"
        progress(label)
        fd, tmp = tempfile.mkstemp(dir=destination.parent, prefix=".download-")
        done, shown = 0, -1
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if size and (percent := done * 100 // size) // 10 != shown:
                        shown = percent // 10
                        progress(f"{label} {percent}%")
            os.replace(tmp, destination)
        except OSError as err:
            Path(tmp).unlink(missing_ok=True)
            raise ArchiveUnavailableError(f"download of {url} broke off: {err}") from err
    return digest.hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _server_dir(unpacked: Path) -> Path:
    """The directory holding llama-server: `llama-<tag>/` now, `build/bin/` in older ones."""
    found = sorted(unpacked.rglob(BINARY), key=lambda p: len(p.parts))
    for candidate in found:
        if candidate.is_file() and not candidate.is_symlink():
            return candidate.parent
    raise ArchiveRejectedError(f"the archive holds no {BINARY}")


def fetch_release(
    req: EngineRequirement, cache_dir: Path, machine: str, nvidia: bool, progress: Progress
) -> Path:
    """A directory holding the verified archive's llama-server and libraries, ready to place.

    Raises ArchiveUnavailableError when nothing can be fetched (the caller builds instead) and
    ArchiveRejectedError when what was fetched must not be used.
    """
    tag = release_tag(req.version)
    name = req.asset or asset_name(tag, machine, nvidia)
    if name is None:
        why = "an NVIDIA node (no Linux CUDA release)" if nvidia else f"processor {machine}"
        raise ArchiveUnavailableError(f"llama.cpp publishes no archive for {why}")
    if not _ASSET.match(name):
        raise ArchiveRejectedError(f"invalid archive name {name!r}")
    url = f"{(req.base_url or GITHUB_RELEASES).rstrip('/')}/{tag}/{name}"
    root = cache_dir / "llamacpp" / "archives"
    root.mkdir(parents=True, exist_ok=True)
    archive = root / name

    # The digest is looked up first (to reuse an archive already here), but a mirror without
    # the archive at all means "build instead", not "refused": that needs the download's word.
    try:
        expected: str | None = published_digest(req, name, url)
        no_digest: ArchiveRejectedError | None = None
    except ArchiveRejectedError as err:
        expected, no_digest = None, err
    if expected is not None and archive.is_file() and _sha256_file(archive) == expected:
        progress(f"using downloaded {name}")
    else:
        actual = _download(url, name, archive, progress)
        if expected is None:
            archive.unlink(missing_ok=True)
            raise no_digest or ArchiveRejectedError(f"no published sha256 for {name}")
        if actual != expected:
            archive.unlink(missing_ok=True)
            raise ArchiveRejectedError(
                f"sha256 mismatch for {name}: published {expected}, downloaded {actual}"
            )

    progress(f"unpacking {name}")
    unpacked = root / f"{name}.d"
    shutil.rmtree(unpacked, ignore_errors=True)
    try:
        safe_extract(archive, unpacked)
    except UnsafeArchiveError as err:
        shutil.rmtree(unpacked, ignore_errors=True)
        raise ArchiveRejectedError(f"{name} refused: {err}") from err
    return _server_dir(unpacked)
