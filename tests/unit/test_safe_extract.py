"""Hostile archives are refused before anything is written; honest ones unpack intact."""

import io
import tarfile
from pathlib import Path

import pytest

from engines.safe_extract import UnsafeArchiveError, safe_extract


def make_tar(path: Path, members: list[tarfile.TarInfo], payloads: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            data = payloads.get(member.name)
            if data is not None:
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
            else:
                tar.addfile(member)
    return path


def file_member(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    return info


def link_member(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def test_honest_sdist_unpacks(tmp_path: Path) -> None:
    exe = file_member("pkg-1.0/llama.cpp/run.sh")
    exe.mode = 0o755
    archive = make_tar(
        tmp_path / "ok.tar.gz",
        [
            file_member("pkg-1.0/README.md"),
            exe,
            link_member("pkg-1.0/llama.cpp/latest.sh", "run.sh"),
        ],
        {"pkg-1.0/README.md": b"hello", "pkg-1.0/llama.cpp/run.sh": b"#!/bin/sh\n"},
    )
    target = tmp_path / "out"
    names = safe_extract(archive, target)
    assert "pkg-1.0/README.md" in names
    assert (target / "pkg-1.0/README.md").read_bytes() == b"hello"
    assert (target / "pkg-1.0/llama.cpp/run.sh").stat().st_mode & 0o111
    assert (target / "pkg-1.0/llama.cpp/latest.sh").resolve() == (
        target / "pkg-1.0/llama.cpp/run.sh"
    ).resolve()


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (file_member("/etc/evil.conf"), "absolute path"),
        (file_member("pkg/../../evil.sh"), "leaves the target"),
        (link_member("pkg/escape", "../../../etc/passwd"), "symlink"),
        (link_member("pkg/abs", "/etc/passwd"), "symlink"),
        (link_member("pkg/hard", "../outside.txt", tarfile.LNKTYPE), "hardlink"),
        (link_member("pkg/hardabs", "/etc/passwd", tarfile.LNKTYPE), "hardlink"),
    ],
)
def test_hostile_member_refused_and_nothing_written(
    tmp_path: Path, member: tarfile.TarInfo, why: str
) -> None:
    payload = {member.name: b"pwned"} if member.isfile() else {}
    # An honest file first: a refused archive must not leave even that behind.
    archive = make_tar(
        tmp_path / "bad.tar.gz",
        [file_member("pkg/innocent.txt"), member],
        {"pkg/innocent.txt": b"fine", **payload},
    )
    target = tmp_path / "out"
    with pytest.raises(UnsafeArchiveError, match=why):
        safe_extract(archive, target)
    assert list(target.iterdir()) == []
    assert not (tmp_path / "evil.sh").exists()


def test_device_nodes_refused(tmp_path: Path) -> None:
    device = tarfile.TarInfo("pkg/null")
    device.type = tarfile.CHRTYPE
    archive = make_tar(tmp_path / "dev.tar.gz", [device], {})
    with pytest.raises(UnsafeArchiveError, match="device"):
        safe_extract(archive, tmp_path / "out")


def test_symlink_inside_pointing_up_but_staying_inside_is_allowed(tmp_path: Path) -> None:
    archive = make_tar(
        tmp_path / "ok.tar.gz",
        [file_member("pkg/a/data.txt"), link_member("pkg/b/data.txt", "../a/data.txt")],
        {"pkg/a/data.txt": b"shared"},
    )
    safe_extract(archive, tmp_path / "out")
    assert (tmp_path / "out/pkg/b/data.txt").read_bytes() == b"shared"


# --- zip -------------------------------------------------------------------------------


def make_zip(path: Path, members: list[tuple[str, bytes, int]]) -> Path:
    """(name, content, unix mode) members; a symlink's content is its target."""
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zf.writestr(info, data)
    return path


def test_honest_zip_unpacks_with_exec_bits_and_inner_links(tmp_path: Path) -> None:
    archive = make_zip(
        tmp_path / "ok.zip",
        [
            ("build/bin/llama-server", b"#!/bin/sh\n", 0o100755),
            ("build/bin/libggml.so.0", b"lib", 0o100644),
            ("build/bin/libggml.so", b"libggml.so.0", 0o120777),
        ],
    )
    names = safe_extract(archive, tmp_path / "out")
    assert len(names) == 3
    server = tmp_path / "out/build/bin/llama-server"
    assert server.stat().st_mode & 0o111
    assert (tmp_path / "out/build/bin/libggml.so").read_bytes() == b"lib"


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("/etc/evil", b"x", 0o100644), "absolute path"),
        (("C:\\Windows\\evil.dll", b"x", 0o100644), "absolute path"),
        (("pkg/../../evil.sh", b"x", 0o100755), "leaves the target"),
        (("pkg\\..\\..\\evil.sh", b"x", 0o100755), "leaves the target"),
        (("pkg/escape", b"../../../etc/passwd", 0o120777), "symlink"),
        (("pkg/abs", b"/etc/passwd", 0o120777), "symlink"),
        (("pkg/fifo", b"", 0o010644), "device or fifo"),
    ],
)
def test_hostile_zip_member_refused_and_nothing_written(
    tmp_path: Path, member: tuple[str, bytes, int], why: str
) -> None:
    archive = make_zip(tmp_path / "bad.zip", [("pkg/innocent.txt", b"fine", 0o100644), member])
    target = tmp_path / "out"
    with pytest.raises(UnsafeArchiveError, match=why):
        safe_extract(archive, target)
    assert list(target.iterdir()) == []
    assert not (tmp_path / "evil.sh").exists()
