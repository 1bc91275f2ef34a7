"""`mirror add` over HTTP from a file server on loopback (tests/unit/mirror_server.py):
progress, resume with Range, a server ignoring Range, truncated bodies, digest mismatches, a
full disk, and a Hugging Face-layout endpoint that wants a token."""

import errno
import logging
import os
from pathlib import Path

import httpx
import pytest

from activities.control.mirror import files
from activities.control.mirror.add import add_source
from activities.control.mirror.errors import MirrorError
from activities.control.mirror.sources import parse_source
from activities.control.mirror.store import MirrorStore
from tests.unit.mirror_server import COMMIT, FileServer, serving
from tests.unit.mirror_store_kit import all_bytes, sha, visible
from workers.cli import build_parser
from workers.commands.mirror import mirror_add, run_mirror_command
from workers.paths import Locations

BODY = os.urandom(3 * (1 << 20) + 123)  # a few chunks of the 1 MiB the download reads


@pytest.fixture
def mirror(tmp_path: Path) -> MirrorStore:
    return MirrorStore(tmp_path / "mirror")


def partials(mirror: MirrorStore) -> list[int]:
    return sorted(p.stat().st_size for p in mirror.tmp.iterdir())


def test_download_with_progress(mirror: MirrorStore) -> None:
    with serving(FileServer(files={"/w/model.gguf": BODY})) as server:
        seen: list[tuple[str, int, int | None]] = []
        source = parse_source(f"{server.url}/w/model.gguf#sha256={sha(BODY)[7:]}")
        added = add_source(mirror, source, progress=lambda *p: seen.append(p))
    assert added.name == "model"
    assert [(f.path, f.digest, f.size) for f in added.manifest.files] == [
        ("model.gguf", sha(BODY), len(BODY))
    ]
    assert mirror.blob_path(sha(BODY)).read_bytes() == BODY
    assert seen[-1] == ("model.gguf", len(BODY), len(BODY))
    assert len(seen) >= 3
    assert all(t == len(BODY) for _, _, t in seen)
    assert partials(mirror) == []


def test_interrupted_download_resumes_with_range(mirror: MirrorStore) -> None:
    with serving(FileServer(files={"/m.gguf": BODY}, cut_after=1_500_000)) as server:
        source = parse_source(f"{server.url}/m.gguf", sha256=sha(BODY))
        with pytest.raises(MirrorError, match=r"truncated download, 1500000 of 3145851 bytes"):
            add_source(mirror, source)
        assert visible(mirror) == ([], [], [])
        assert partials(mirror) == [1_500_000]

        added = add_source(mirror, source)
    assert [s.range for s in server.seen] == [None, "bytes=1500000-"]
    assert added.manifest.files[0].digest == sha(BODY)
    assert mirror.blob_path(sha(BODY)).read_bytes() == BODY
    assert partials(mirror) == []


def test_server_ignoring_range_starts_over(mirror: MirrorStore) -> None:
    server = FileServer(files={"/m.gguf": BODY}, cut_after=1000, ignore_range=True)
    with serving(server):
        source = parse_source(f"{server.url}/m.gguf")
        with pytest.raises(MirrorError, match="truncated"):
            add_source(mirror, source)
        added = add_source(mirror, source)
    assert server.seen[1].range == "bytes=1000-"  # asked to resume, got the whole file
    assert added.manifest.files[0].digest == sha(BODY)
    assert mirror.blob_path(sha(BODY)).read_bytes() == BODY


def test_a_file_changed_since_the_partial_began_is_fetched_whole(mirror: MirrorStore) -> None:
    server = FileServer(files={"/m.gguf": BODY}, cut_after=5000, etag='"v1"')
    with serving(server):
        source = parse_source(f"{server.url}/m.gguf")
        with pytest.raises(MirrorError, match="truncated"):
            add_source(mirror, source)
        changed = os.urandom(len(BODY))
        server.files["/m.gguf"], server.etag = changed, '"v2"'
        added = add_source(mirror, source)
    assert (server.seen[1].range, server.seen[1].if_range) == ("bytes=5000-", '"v1"')
    assert added.manifest.files[0].digest == sha(changed)
    assert mirror.blob_path(sha(changed)).read_bytes() == changed
    assert list(mirror.tmp.iterdir()) == []


def test_a_known_digest_already_mirrored_is_not_downloaded(mirror: MirrorStore) -> None:
    with serving(FileServer(files={"/m.gguf": BODY, "/copy.gguf": BODY})) as server:
        add_source(mirror, parse_source(f"{server.url}/m.gguf"))
        again = add_source(mirror, parse_source(f"{server.url}/copy.gguf", sha256=sha(BODY)))
    assert [s.path for s in server.seen] == ["/m.gguf"]
    assert again.new_bytes == 0
    assert again.manifest.files[0].size == len(BODY)


def test_a_partial_longer_than_the_file_now_is_refused_and_restarted(
    mirror: MirrorStore,
) -> None:
    """The file shrank on a server that sends no ETag: the resume gets 416 and starts over."""
    with serving(FileServer(files={"/m.gguf": BODY}, cut_after=200_000)) as server:
        source = parse_source(f"{server.url}/m.gguf")
        with pytest.raises(MirrorError, match="truncated"):
            add_source(mirror, source)
        server.files["/m.gguf"] = b"short now"
        added = add_source(mirror, source)
    assert [s.range for s in server.seen] == [None, "bytes=200000-", None]
    assert added.manifest.files[0].digest == sha(b"short now")


def test_digest_mismatch_names_both_and_leaves_nothing(mirror: MirrorStore) -> None:
    wrong = "0" * 64
    with serving(FileServer(files={"/m.gguf": BODY})) as server, pytest.raises(MirrorError) as err:
        add_source(mirror, parse_source(f"{server.url}/m.gguf#sha256={wrong}"))
    assert f"expected sha256:{wrong}" in str(err.value)
    assert f"hashes to {sha(BODY)}" in str(err.value)
    assert visible(mirror) == ([], [], [])
    assert partials(mirror) == []  # wrong bytes are not kept for a resume


def test_http_error_and_unreachable_server(mirror: MirrorStore) -> None:
    with serving(FileServer()) as server:
        with pytest.raises(MirrorError, match="HTTP 404"):
            add_source(mirror, parse_source(f"{server.url}/missing.gguf"))
        url = server.url
    with pytest.raises(MirrorError, match=r"download failed \(ConnectError"):
        add_source(mirror, parse_source(f"{url}/gone.gguf"))
    assert visible(mirror) == ([], [], [])
    assert partials(mirror) == []  # nothing was received, so nothing is kept to resume


def test_full_disk_keeps_the_partial_for_a_resume(
    mirror: MirrorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = files.write_all
    written = 0

    def filling(f: object, data: bytes) -> None:
        nonlocal written
        if written >= 1 << 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(f, data)  # type: ignore[arg-type]
        written += len(data)

    with serving(FileServer(files={"/m.gguf": BODY})) as server:
        source = parse_source(f"{server.url}/m.gguf")
        monkeypatch.setattr(files, "write_all", filling)
        with pytest.raises(MirrorError, match="no space left on the mirror's disk") as err:
            add_source(mirror, source)
        assert "kept in tmp/" in str(err.value)
        assert visible(mirror) == ([], [], [])
        assert partials(mirror) == [written]  # every byte written before the disk filled
        monkeypatch.setattr(files, "write_all", real)
        add_source(mirror, source)
    assert server.seen[-1].range == f"bytes={written}-"
    assert mirror.blob_path(sha(BODY)).read_bytes() == BODY


TOKEN = "hf_s3cret-token-for-tests"
REPO = {"model.gguf": BODY, "tokenizer/config.json": b'{"x": 1}'}


def test_hugging_face_endpoint_with_token_from_env(
    mirror: MirrorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_HF_TOKEN", TOKEN)
    with serving(FileServer(hf_repos={"org/smol": REPO}, token=TOKEN)) as server:
        words = ["mirror", "add", "hf://org/smol", "--hf-endpoint", server.url]
        args = build_parser().parse_args([*words, "--hf-token-env", "MY_HF_TOKEN"])
        added = mirror_add(mirror, args)
        paths = [s.path for s in server.seen]
    assert paths == [
        "/api/models/org/smol/revision/main",
        f"/org/smol/resolve/{COMMIT}/model.gguf",
        f"/org/smol/resolve/{COMMIT}/tokenizer/config.json",
    ]
    assert added.name == "smol"
    assert {f.path: f.digest for f in added.manifest.files} == {p: sha(b) for p, b in REPO.items()}
    assert added.manifest.source == f"hf://org/smol@{COMMIT} via {server.url}"
    assert TOKEN.encode() not in all_bytes(mirror.root)
    assert not any(TOKEN in p.name for p in mirror.root.rglob("*"))


def test_hugging_face_without_the_token_is_refused(mirror: MirrorStore) -> None:
    with serving(FileServer(hf_repos={"org/smol": REPO}, token=TOKEN)) as server:
        source = parse_source("hf://org/smol@main/model.gguf", hf_endpoint=server.url)
        with pytest.raises(MirrorError, match=r"HTTP 401.*--hf-token-env"):
            add_source(mirror, source)
    assert visible(mirror) == ([], [], [])


def test_token_file_and_named_files(mirror: MirrorStore, tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    with serving(FileServer(hf_repos={"org/smol": REPO}, token=TOKEN)) as server:
        words = ["mirror", "add", "hf://org/smol@v2/model.gguf", "--name", "w"]
        args = build_parser().parse_args(
            [*words, "--hf-endpoint", server.url, "--hf-token-file", str(tmp_path / "token")]
        )
        added = mirror_add(mirror, args)
        assert [s.path for s in server.seen] == ["/org/smol/resolve/v2/model.gguf"]
        assert {s.authorization for s in server.seen} == {f"Bearer {TOKEN}"}
    assert [f.path for f in added.manifest.files] == ["model.gguf"]
    assert TOKEN.encode() not in all_bytes(mirror.root)


def test_a_second_add_of_the_same_url_at_once_is_refused(mirror: MirrorStore) -> None:
    """The partial is locked while one add writes it: a second add says so, and the first
    still completes whole."""
    with serving(FileServer(files={"/m.gguf": BODY})) as server:
        source = parse_source(f"{server.url}/m.gguf")
        refused: list[str] = []

        def second_add(*_progress: object) -> None:
            if not refused:
                with pytest.raises(MirrorError) as err:
                    add_source(mirror, source, name="other")
                refused.append(str(err.value))

        added = add_source(mirror, source, progress=second_add)
    assert "another `llmgw mirror add` is downloading" in refused[0]
    assert mirror.refs() == {"m": added.digest}
    assert mirror.blob_path(sha(BODY)).read_bytes() == BODY


def test_timeouts_are_set() -> None:
    from activities.control.mirror.http_download import TIMEOUT

    assert isinstance(TIMEOUT, httpx.Timeout)
    assert TIMEOUT.connect
    assert TIMEOUT.read


def test_cli_prints_progress_to_stderr_and_the_files_to_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = str(tmp_path / "state")
    with serving(FileServer(files={"/w/model.gguf": BODY})) as server:
        words = ["mirror", "add", f"{server.url}/w/model.gguf", "--state-dir", state]
        run_mirror_command(build_parser().parse_args(words), Locations.resolve(state))
    out, err = capsys.readouterr()
    assert "model.gguf: 100% (3.0 MiB of 3.0 MiB)" in err.splitlines()
    assert len(err.splitlines()) >= 3
    assert out.splitlines()[0].startswith("model: sha256:")
    assert f"  model.gguf  {sha(BODY)}  {len(BODY)} bytes" in out.splitlines()


def test_a_listing_naming_a_path_outside_the_artifact_is_refused(mirror: MirrorStore) -> None:
    evil = {"model.gguf": b"w", "../../refs/evil.json": b'{"manifest": "x"}'}
    with serving(FileServer(hf_repos={"org/evil": evil})) as server:
        source = parse_source("hf://org/evil", hf_endpoint=server.url)
        with pytest.raises(MirrorError, match="not a safe relative path"):
            add_source(mirror, source)
        assert [s.path for s in server.seen] == ["/api/models/org/evil/revision/main"]
    assert visible(mirror) == ([], [], [])


def test_credentials_in_a_url_reach_no_log_line_and_no_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    state = str(tmp_path / "state")
    caplog.set_level(logging.DEBUG)
    with serving(FileServer(files={"/m.gguf": b"weights"})) as server:
        url = server.url.replace("http://", "http://alice:pw-s3cret@") + "/m.gguf?sig=q-s3cret"
        words = ["mirror", "add", url, "--state-dir", state]
        run_mirror_command(build_parser().parse_args(words), Locations.resolve(state))
    out, err = capsys.readouterr()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for secret in ("pw-s3cret", "q-s3cret", "alice"):
        assert secret not in logged
        assert secret not in out + err
        assert secret.encode() not in all_bytes(tmp_path / "state")
    mirror = MirrorStore(Locations.resolve(state).mirror_dir)
    assert mirror.read_manifest(mirror.refs()["m"]).source == f"{server.url}/m.gguf"
