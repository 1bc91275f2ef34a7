"""A library an engine lacks, installed from the node's own package sources only with the
operator's consent: the packages named, the command said or run, and the whole path on a real
binary that ldd finds a library missing for (the package manager a stand-in that puts it back),
and the command simulated by this machine's own apt."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from engines import os_packages
from engines.install_llamacpp import with_os_packages
from engines.os_packages import install_command, install_missing, packages_for
from engines.verify import verify_llamacpp

# llama-server prints its version on stderr; this one asks its library for the number.
MAIN = """#include <stdio.h>
int helper(void);
int main(void) { fprintf(stderr, "version: %d (test)\\n", helper()); return 0; }
"""


def test_libraries_name_their_packages_on_each_distribution() -> None:
    libraries = ["libgomp.so.1", "libssl.so.3", "libcrypto.so.3", "libmystery.so.9"]
    assert packages_for(libraries, "apt-get") == (["libgomp1", "libssl3"], ["libmystery.so.9"])
    assert packages_for(libraries, "dnf") == (["libgomp", "openssl-libs"], ["libmystery.so.9"])


def test_without_consent_the_exact_command_is_said_and_nothing_runs() -> None:
    ran: list[list[str]] = []

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    outcome = install_missing(["libgomp.so.1"], False, "apt-get", run=run)
    assert not outcome.installed
    assert "`apt-get install -y --no-install-recommends libgomp1`" in outcome.detail
    assert "--install-os-packages" in outcome.detail
    assert ran == []


def test_with_consent_the_nodes_package_manager_installs_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[list[str]] = []

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    # os_packages asks os.geteuid (the one os module) whether it runs as root.
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    outcome = install_missing(["libnuma.so.1"], True, "dnf", run=run)
    assert outcome.installed
    assert ran == [["dnf", "install", "-y", "numactl-libs"]]
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    refused = install_missing(["libnuma.so.1"], True, "dnf", run=run)
    assert not refused.installed
    assert "needs root" in refused.detail


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="this machine has no apt-get")
def test_this_machines_apt_accepts_the_command() -> None:
    done = subprocess.run(
        install_command("apt-get", ["libgomp1"], simulate=True),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "libgomp1" in done.stdout


@pytest.fixture
def lacking_binary(tmp_path: Path) -> tuple[Path, Path]:
    """A binary whose library ldd cannot find (its rpath directory emptied), and the library."""
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler to build the test binary")
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    (tmp_path / "helper.c").write_text("int helper(void) { return 7; }\n")
    (tmp_path / "main.c").write_text(MAIN)
    library = lib_dir / "libllmgwhelper.so.1"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libllmgwhelper.so.1", "-o", str(library),
         str(tmp_path / "helper.c")],
        check=True,
    )  # fmt: skip
    (lib_dir / "libllmgwhelper.so").symlink_to(library.name)
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    subprocess.run(
        ["gcc", "-o", str(binary), str(tmp_path / "main.c"), f"-L{lib_dir}", "-lllmgwhelper",
         f"-Wl,-rpath,{lib_dir}"],
        check=True,
    )  # fmt: skip
    kept = tmp_path / "kept.so"
    library.rename(kept)
    return binary, kept


def test_a_missing_library_is_installed_with_consent_and_the_binary_verified_again(
    lacking_binary: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    binary, kept = lacking_binary
    failed = verify_llamacpp(binary)
    assert not failed.ok
    assert "missing libraries libllmgwhelper.so.1" in failed.detail
    # A package this llmgw does not know of: said, not guessed.
    unknown = with_os_packages(binary, failed, True, lambda _line: None)
    assert not unknown.ok
    assert "no known package ships libllmgwhelper.so.1" in unknown.detail

    # Known, with a package manager that puts the library back where the binary looks.
    packages = {**os_packages.LIBRARY_PACKAGES, "libllmgwhelper.so.1": ("llmgw-helper", "h")}
    monkeypatch.setattr(os_packages, "LIBRARY_PACKAGES", packages)
    monkeypatch.setattr(os_packages, "package_manager", lambda: "apt-get")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    ran: list[list[str]] = []

    def apt(argv: list[str]) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        shutil.copy(kept, binary.parent.parent / "lib" / "libllmgwhelper.so.1")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(os_packages, "_run", apt)
    said = with_os_packages(binary, failed, False, lambda _line: None)
    assert not said.ok
    assert "`apt-get install -y --no-install-recommends llmgw-helper`" in said.detail
    assert ran == []
    lines: list[str] = []
    mended = with_os_packages(binary, failed, True, lines.append)
    assert mended.ok, mended.detail
    assert mended.detail == "version: 7 (test)"
    assert "installed llmgw-helper with apt-get" in mended.notes
    assert ran == [["apt-get", "install", "-y", "--no-install-recommends", "llmgw-helper"]]
    assert lines == ["installing what ships libllmgwhelper.so.1 from this node's package sources"]
