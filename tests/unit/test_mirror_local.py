"""`mirror add` of local files, directories and Ollama's store, `rm` and `gc`, on tmp_path."""

import errno
import json
import os
from pathlib import Path

import pytest

from activities.control.mirror import files
from activities.control.mirror.add import add_source
from activities.control.mirror.errors import MirrorError
from activities.control.mirror.gc import collect
from activities.control.mirror.sources import LocalSource, OllamaSource
from activities.control.mirror.store import MirrorStore
from tests.ollama_kit import ollama_store
from tests.unit.mirror_store_kit import sha, visible
from workers.cli import build_parser
from workers.commands.mirror import run_mirror_command
from workers.commands.model import mirror_ollama_model
from workers.ollama.mirror_add import add_ollama
from workers.paths import Locations
from workflows.artifact_names import blob_relpath, manifest_digest

WEIGHTS = b"GGUF" + os.urandom(3000)


@pytest.fixture
def mirror(tmp_path: Path) -> MirrorStore:
    return MirrorStore(tmp_path / "mirror")


def test_file_then_directory_share_one_blob(mirror: MirrorStore, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "tok").mkdir(parents=True)
    (src / "model.gguf").write_bytes(WEIGHTS)
    (src / "tok" / "config.json").write_bytes(b"{}")

    one = add_source(mirror, LocalSource(str(src / "model.gguf")))
    assert one.name == "model"
    assert [(f.path, f.digest, f.size) for f in one.manifest.files] == [
        ("model.gguf", sha(WEIGHTS), len(WEIGHTS))
    ]
    both = add_source(mirror, LocalSource(str(src)), name="both")
    assert [f.path for f in both.manifest.files] == ["model.gguf", "tok/config.json"]
    assert both.new_bytes == 2  # the weights were already there
    again = add_source(mirror, LocalSource(str(src)), name="both")
    assert again.digest == both.digest
    assert again.new_bytes == 0

    assert (mirror.root / blob_relpath(sha(WEIGHTS))).read_bytes() == WEIGHTS
    assert len(list(mirror.blobs.iterdir())) == 2
    assert mirror.refs() == {"model": one.digest, "both": both.digest}
    stored = json.loads((mirror.manifests / f"{both.digest[7:]}.json").read_text())
    assert stored["source"] == str(src)
    assert manifest_digest(mirror.read_manifest(both.digest)) == both.digest
    assert list(mirror.tmp.iterdir()) == []


def test_gc_removes_exactly_what_no_ref_reaches(mirror: MirrorStore, tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"shared")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.gguf").write_bytes(b"shared")
    (tmp_path / "d" / "only.bin").write_bytes(b"only in d")
    kept = add_source(mirror, LocalSource(str(tmp_path / "a.gguf")), name="kept")
    gone = add_source(mirror, LocalSource(str(tmp_path / "d")), name="gone")
    stale = mirror.tmp / "get-old.partial"
    stale.write_bytes(b"x" * 10)
    os.utime(stale, (1, 1))
    (mirror.tmp / "get-new.partial").write_bytes(b"y")
    assert mirror.remove_ref("gone")
    gone_size = mirror.manifest_path(gone.digest).stat().st_size

    dry = collect(mirror, tmp_max_age_s=3600, dry_run=True)
    assert dry.manifests == [gone.digest]
    assert dry.blobs == [sha(b"only in d")]
    assert dry.partials == ["get-old.partial"]
    assert len(list(mirror.manifests.iterdir())) == 2  # nothing removed yet

    plan = collect(mirror, tmp_max_age_s=3600, dry_run=False)
    assert plan.partials == ["get-old.partial"]
    assert [p.name for p in mirror.manifests.iterdir()] == [f"{kept.digest[7:]}.json"]
    assert [p.name for p in mirror.blobs.iterdir()] == [sha(b"shared")[7:]]
    assert [p.name for p in mirror.tmp.iterdir()] == ["get-new.partial"]
    assert plan.freed == dry.freed == len(b"only in d") + gone_size + 10


def test_gc_during_an_add_is_refused_and_removes_nothing(
    mirror: MirrorStore, tmp_path: Path
) -> None:
    """gc run while an add has copied its blob but not yet written the manifest listing it."""
    (tmp_path / "m.gguf").write_bytes(WEIGHTS)
    refusals: list[str] = []

    def gc_now(*_progress: object) -> None:
        with pytest.raises(MirrorError) as err:
            collect(mirror, 0, dry_run=False)
        refusals.append(str(err.value))

    added = add_source(mirror, LocalSource(str(tmp_path / "m.gguf")), progress=gc_now)
    assert refusals
    assert all("mirror add` is running" in r for r in refusals)
    plan = collect(mirror, 0, dry_run=False)
    assert (plan.manifests, plan.blobs) == ([], [])
    assert mirror.blob_path(added.manifest.files[0].digest).read_bytes() == WEIGHTS


def test_two_adds_of_the_same_bytes_at_once_store_one_blob(
    mirror: MirrorStore, tmp_path: Path
) -> None:
    """The second add runs whole while the first is half-way through copying the same file."""
    (tmp_path / "m.gguf").write_bytes(WEIGHTS * 700)  # more than one 1 MiB chunk
    source = LocalSource(str(tmp_path / "m.gguf"))
    inner: list[str] = []

    def second_add(*_progress: object) -> None:
        if not inner:
            inner.append(add_source(mirror, source, name="second").digest)

    first = add_source(mirror, source, name="first", progress=second_add)
    assert mirror.refs() == {"first": first.digest, "second": inner[0]}
    assert first.digest == inner[0]
    assert first.new_bytes == 0  # the second add stored the blob first
    assert [p.name for p in mirror.blobs.iterdir()] == [sha(WEIGHTS * 700)[7:]]
    assert mirror.blob_path(sha(WEIGHTS * 700)).read_bytes() == WEIGHTS * 700
    assert list(mirror.tmp.iterdir()) == []


def test_directory_links_out_and_fifos_refused(mirror: MirrorStore, tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("outside")
    d = tmp_path / "d"
    d.mkdir()
    (d / "w.gguf").write_bytes(b"w")
    (d / "inside-link").symlink_to(d / "w.gguf")
    assert [f.path for f in add_source(mirror, LocalSource(str(d))).manifest.files] == [
        "inside-link",
        "w.gguf",
    ]
    (d / "out").symlink_to(tmp_path / "secret")
    with pytest.raises(MirrorError, match="outside"):
        add_source(mirror, LocalSource(str(d)))
    (d / "out").unlink()
    os.mkfifo(d / "pipe")
    with pytest.raises(MirrorError, match="not a regular file"):
        add_source(mirror, LocalSource(str(d)))
    (d / "pipe").unlink()
    (d / "bad name.gguf").write_bytes(b"x")
    with pytest.raises(MirrorError, match="not a safe relative path"):
        add_source(mirror, LocalSource(str(d)))


def test_a_directory_is_named_after_itself(mirror: MirrorStore, tmp_path: Path) -> None:
    (tmp_path / "SmolLM2 135M").mkdir()
    (tmp_path / "SmolLM2 135M" / "model.gguf").write_bytes(b"w")
    added = add_source(mirror, LocalSource(str(tmp_path / "SmolLM2 135M")))
    assert added.name == "SmolLM2-135M"
    assert [f.path for f in added.manifest.files] == ["model.gguf"]


@pytest.mark.parametrize("name", ["../escape", "refs/x", "/abs", ".."])
def test_traversal_names_refused(mirror: MirrorStore, tmp_path: Path, name: str) -> None:
    (tmp_path / "m.gguf").write_bytes(b"m")
    with pytest.raises(MirrorError, match="not a mirror name"):
        add_source(mirror, LocalSource(str(tmp_path / "m.gguf")), name=name)
    assert not (tmp_path / "escape.json").exists()
    assert visible(mirror) == ([], [], [])


def test_full_disk_is_named_and_leaves_nothing(
    mirror: MirrorStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "m.gguf").write_bytes(WEIGHTS)

    def full(*_write: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "write_all", full)
    with pytest.raises(MirrorError, match=r"no space left on the mirror's disk .* m\.gguf"):
        add_source(mirror, LocalSource(str(tmp_path / "m.gguf")))
    assert visible(mirror) == ([], [], [])
    assert list(mirror.tmp.iterdir()) == []  # a local copy is redone, not resumed


def test_ollama_model_and_adapter(mirror: MirrorStore, tmp_path: Path) -> None:
    gguf = tmp_path / "w.gguf"
    gguf.write_bytes(WEIGHTS)
    store = tmp_path / "ollama"
    weights_hex = ollama_store(store, gguf, {"stop": ["<|im_end|>"]})
    added = add_ollama(mirror, OllamaSource("smollm2:135m"), str(store), None)
    assert added.name == "smollm2-135m"
    assert [(f.path, f.digest) for f in added.manifest.files] == [
        ("model.gguf", f"sha256:{weights_hex}")
    ]
    assert added.manifest.source == "ollama:smollm2:135m"

    # A corrupt blob is refused, naming the digest it should have had.
    (store / "blobs" / f"sha256-{weights_hex}").write_bytes(b"GGUF" + b"\0" * (len(WEIGHTS) - 4))
    other = MirrorStore(tmp_path / "other")
    with pytest.raises(MirrorError, match=f"expected sha256:{weights_hex}"):
        add_ollama(other, OllamaSource("smollm2:135m"), str(store), None)
    assert visible(other) == ([], [], [])


def test_cli_add_ls_rm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.gguf").write_bytes(WEIGHTS)
    state = str(tmp_path / "state")

    def run(*words: str) -> str:
        args = build_parser().parse_args(["mirror", *words, "--state-dir", state])
        run_mirror_command(args, Locations.resolve(state))
        return capsys.readouterr().out

    out = run("add", str(tmp_path / "m.gguf"), "--name", "m")
    assert f"m.gguf  {sha(WEIGHTS)}  {len(WEIGHTS)} bytes" in out
    manifest = out.split()[1]  # "m: sha256:<manifest> (...)"
    listing = run("ls")
    assert listing.splitlines()[1].split()[:2] == ["m", manifest[: len("sha256:") + 16]]
    assert str(tmp_path / "m.gguf") in listing
    assert "removed m" in run("rm", "m")
    with pytest.raises(SystemExit, match="no name 'm'"):
        run("rm", "m")
    assert "1 blob(s)" in run("gc")


def test_import_ollama_mirror_flag_adds_the_model_under_its_name(tmp_path: Path) -> None:
    gguf = tmp_path / "w.gguf"
    gguf.write_bytes(WEIGHTS)
    weights_hex = ollama_store(tmp_path / "ollama", gguf, {})
    state = str(tmp_path / "state")
    words = ["model", "import-ollama", "smollm2:135m", "--store", str(tmp_path / "ollama")]
    args = build_parser().parse_args([*words, "--mirror", "--state-dir", state])
    line = mirror_ollama_model(Locations.resolve(state), args, "smollm2-135m")
    mirror = MirrorStore(Locations.resolve(state).mirror_dir)
    assert line == f"mirror: smollm2-135m -> {mirror.refs()['smollm2-135m']} (1 file(s))"
    assert mirror.blob_path(f"sha256:{weights_hex}").read_bytes() == WEIGHTS
    assert not build_parser().parse_args(words).mirror
