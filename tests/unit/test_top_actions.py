"""`llmgw top`'s actions and its Models and Mirror panes without a terminal or a server: the
key state machine (keys in, choices and actions out), the lines drawn, the panes' rows from
made-up readings, the console loop on a scripted window, and the Ollama import through the web
console's import code into a real state dir and mirror from a made-up Ollama store (the model
definition recorded instead of reaching a model workflow)."""

import asyncio
import curses
import threading
from pathlib import Path
from typing import Any

import pytest

from activities.control.mirror.store import MirrorStore
from tests.ollama_kit import ollama_store
from workers import console_cluster, console_import
from workers.commands.mirror import artifacts_used, mirror_entries
from workers.fetch_progress import FetchStatus
from workers.ollama.model_import import BlobProgress, ImportPlan, fetch_blobs
from workers.ollama.store import CHUNK, Blob
from workers.paths import Locations
from workers.top.catalog import artifact_rows, fetch_rows, model_rows
from workers.top.console import console
from workers.top.data import ArtifactRow, FetchRow, ModelRow, NodeRow, TopData
from workers.top.keys import QUIT, Action, Prompt, UiState, handle_key
from workers.top.operate import ActionFailed, ActionRefused, LiveOperator
from workers.top.render import Screen, render, selectable
from workflows.contracts import (
    ArtifactFetchView,
    ArtifactManifest,
    FetchProgressReport,
    LoraAdapter,
    ModelSpec,
    ModelView,
    Profile,
    ReplicaState,
    Route,
)

ENTER, ESC, BACKSPACE = 10, 27, curses.KEY_BACKSPACE
NODES, MODELS, MIRROR = 0, 3, 4
DIGEST = "sha256:" + "ab" * 32


def press(ui: UiState, text: str, targets: tuple[str, ...] = ()) -> UiState:
    for char in text:
        ui, action = handle_key(ui, ord(char), targets)
        assert action is None
    return ui


def data() -> TopData:
    return TopData(
        taken_at=1.0,
        nodes=[
            NodeRow(name="gpu-b", state="ready"),
            NodeRow(name="gpu-a", state="ready", cordoned=True),
        ],
        catalog=[
            ModelRow(name="chat", wanted=2, ready=1, engine="vllm"),
            ModelRow(name="smol", wanted=1, ready=1, engine="llamacpp"),
        ],
        mirror=[
            ArtifactRow(
                name="smol",
                digest=DIGEST,
                size=3 << 20,
                files=1,
                source="ollama:smollm2:135m",
                models=["smol"],
            ),
            ArtifactRow(name="broken", digest="sha256:" + "cd" * 32, problem="manifest missing"),
        ],
        mirror_dir="/state/mirror",
        fetches=[
            FetchRow(
                node="gpu-b",
                artifact="sha256:abababababab",
                model="smol",
                state="fetching",
                progress="0.10 of 0.30 GB (33%)",
            )
        ],
    )


def test_cordon_asks_a_reason_then_enter_sends_it_for_the_selected_node() -> None:
    targets = ("gpu-a", "gpu-b")
    ui, action = handle_key(UiState(), curses.KEY_DOWN, targets)
    assert ui.selected == 1
    ui, _ = handle_key(ui, curses.KEY_DOWN, targets)
    assert ui.selected == 1  # the last node: stays
    ui, action = handle_key(ui, ord("c"), targets)
    assert action is None
    assert ui.prompt == Prompt("cordon", "gpu-b")
    assert ui.help.startswith("cordon node gpu-b; reason (optional): _")
    # Typed keys are the reason's, even those that are keys elsewhere (q quits, s sorts).
    ui = press(ui, "disk qs")
    ui, _ = handle_key(ui, BACKSPACE)
    assert ui.prompt is not None
    assert ui.prompt.text == "disk q"
    ui, action = handle_key(ui, ENTER)
    assert action == Action("cordon", "gpu-b", "disk q")
    assert ui.prompt is None


def test_esc_cancels_and_nothing_is_sent() -> None:
    ui, _ = handle_key(UiState(), ord("d"), ("gpu-a",))
    assert ui.prompt == Prompt("drain", "gpu-a")
    assert "cordon, then move its replicas" in ui.help
    ui, action = handle_key(ui, ESC)
    assert (action, ui.prompt, ui.status) == (None, None, "drain: cancelled")


def test_uncordon_takes_no_text_and_y_or_enter_confirms() -> None:
    ui, _ = handle_key(UiState(), ord("u"), ("gpu-a",))
    ui, action = handle_key(ui, ord("x"))
    assert action is None
    assert ui.prompt is not None
    assert ui.prompt.text == ""
    assert handle_key(ui, ord("y"))[1] == Action("uncordon", "gpu-a", "")
    assert handle_key(ui, ENTER)[1] == Action("uncordon", "gpu-a", "")


def test_scale_refuses_a_count_that_is_not_one_before_sending() -> None:
    ui = UiState(pane=MODELS)
    ui, _ = handle_key(ui, ord("n"), ("chat", "smol"))
    assert ui.prompt == Prompt("scale", "chat")
    ui = press(ui, "-1")
    ui, action = handle_key(ui, ENTER)
    assert action is None
    assert ui.prompt is not None
    assert ui.prompt.error == "the replica count is a whole number, 0 or more, not '-1'"
    assert ui.foot == [
        "! the replica count is a whole number, 0 or more, not '-1'",
        "scale model chat to how many replicas: -1_   enter: do it  esc: cancel",
    ]
    ui, _ = handle_key(ui, BACKSPACE)
    ui, _ = handle_key(ui, BACKSPACE)
    ui = press(ui, "3")
    assert ui.prompt is not None
    assert ui.prompt.error == ""
    assert handle_key(ui, ENTER)[1] == Action("scale", "chat", "3")


def test_import_asks_ollamas_name_and_optionally_the_models_and_refuses_bad_shapes() -> None:
    ui, _ = handle_key(UiState(pane=MIRROR), ord("i"))
    assert ui.prompt == Prompt("import", "")
    assert ui.help.startswith(
        "import from Ollama as a model and into the mirror, NAME[:TAG] [as MODEL]: _"
    )
    ui, action = handle_key(ui, ENTER)
    assert action is None
    assert ui.prompt is not None
    assert "name the Ollama model" in ui.prompt.error
    for typed, words in [
        ("../etc", "is not an Ollama model name"),
        ("smollm2:135m smol", "type NAME[:TAG], or NAME[:TAG] as MODEL, not 'smollm2:135m smol'"),
        ("smollm2:135m as", "type NAME[:TAG], or NAME[:TAG] as MODEL"),
        ("../etc as smol", "is not an Ollama model name"),
    ]:
        ui, _ = handle_key(UiState(pane=MIRROR), ord("i"))
        ui, action = handle_key(press(ui, typed), ENTER)
        assert action is None, typed
        assert ui.prompt is not None
        assert words in ui.prompt.error, (typed, ui.prompt.error)
    ui, _ = handle_key(UiState(pane=MIRROR), ord("i"))
    ui = press(ui, " smollm2:135m ")
    assert handle_key(ui, ENTER)[1] == Action("import", "", "smollm2:135m")
    ui, _ = handle_key(UiState(pane=MIRROR), ord("i"))
    ui = press(ui, "smollm2:135m as smol")
    assert handle_key(ui, ENTER)[1] == Action("import", "", "smollm2:135m as smol")


def test_an_action_key_elsewhere_or_without_rows_says_why_it_did_nothing() -> None:
    ui, action = handle_key(UiState(pane=1), ord("c"), ())
    assert (action, ui.prompt) == (None, None)
    assert ui.status == "cordon: in the Nodes pane (tab to it)"
    ui, _ = handle_key(UiState(pane=MODELS), ord("n"), ())
    assert (ui.prompt, ui.status) == (None, "scale: no model to scale")
    assert handle_key(UiState(), ord("q"))[1] == QUIT


def test_the_selected_row_is_marked_and_scrolled_into_view() -> None:
    top = TopData(taken_at=0, nodes=[NodeRow(name=f"n{i:02d}", state="ready") for i in range(30)])
    ui = UiState(selected=25)
    assert selectable(top, ui)[25] == "n25"
    lines = render(Screen(top, []), ui, 80, 12)
    assert lines[3].startswith("  NODE")
    marked = [line for line in lines if line.startswith("> ")]
    assert [line.split()[1] for line in marked] == ["n25"]
    # A selection past the end (the node went): the last node is marked.
    lines = render(Screen(top, []), UiState(selected=99), 80, 12)
    assert [line.split()[1] for line in lines if line.startswith("> ")] == ["n29"]


def test_the_prompt_and_the_status_take_the_bottom_lines() -> None:
    ui = UiState(status="node gpu-a: cordon done", prompt=Prompt("scale", "chat", "4"))
    lines = render(Screen(data(), []), ui, 120, 10)
    assert lines[-2].rstrip() == "node gpu-a: cordon done"
    assert lines[-1].startswith("scale model chat to how many replicas: 4_   enter: do it")


def test_the_models_pane_shows_wanted_and_ready() -> None:
    lines = render(Screen(data(), []), UiState(pane=MODELS, selected=1), 120, 20)
    assert "[Models]" in lines[1]
    assert lines[3].split() == ["MODEL", "WANTED", "READY", "ENGINE", "NOTE"]
    assert lines[4].split() == ["chat", "2", "1", "vllm"]
    assert lines[5].split() == [">", "smol", "1", "1", "llamacpp"]
    assert lines[-1].rstrip().endswith("n scale")


def test_the_mirror_pane_shows_the_artifacts_their_users_and_the_fetches() -> None:
    lines = [line.rstrip() for line in render(Screen(data(), []), UiState(pane=MIRROR), 140, 20)]
    assert lines[3].split() == ["NAME", "ARTIFACT", "SIZE", "FILES", "USED", "BY", "SOURCE"]
    assert lines[4].split() == [
        "smol",
        "sha256:abababababab",
        "3.0",
        "MiB",
        "1",
        "smol",
        "ollama:smollm2:135m",
    ]
    assert lines[5].split()[:3] == ["broken", "sha256:cdcdcdcdcdcd", "?"]
    assert lines[5].endswith("manifest missing")
    assert lines[6] == "2 name(s), 3.0 MiB in the mirror at /state/mirror"
    assert "Fetches onto nodes in progress:" in lines
    (fetch,) = [line for line in lines if line.startswith("gpu-b")]
    assert fetch.split()[:4] == ["gpu-b", "sha256:abababababab", "smol", "fetching"]
    assert "0.10 of 0.30 GB (33%)" in fetch
    assert lines[-1].endswith("i import from Ollama")
    empty = render(Screen(TopData(taken_at=0), []), UiState(pane=MIRROR), 100, 12)
    assert "the mirror is empty: i imports a model from Ollama" in "\n".join(empty)
    assert "no fetch running" in "\n".join(empty)


def test_the_panes_rows_from_the_catalog_the_mirror_and_the_fetches() -> None:
    chat = ModelSpec(
        name="chat",
        replicas=2,
        artifact=DIGEST,
        profiles=[Profile(engine="llamacpp", lora=[LoraAdapter(name="a", path="", artifact="x")])],
    )
    smol = ModelSpec(name="smol", artifact=DIGEST)
    views = [ModelView(spec=smol), ModelView(spec=chat, removing=True)]
    route = Route(
        replica_id="chat-0",
        model="chat",
        node="n",
        endpoint="http://n:1",
        engine="llamacpp",
        state=ReplicaState.READY,
    )
    pending = route.model_copy(update={"replica_id": "chat-1", "state": ReplicaState.PENDING})
    rows = model_rows(views, [route, pending])
    assert [(r.name, r.wanted, r.ready, r.removing) for r in rows] == [
        ("chat", 2, 1, True),
        ("smol", 1, 0, False),
    ]
    used = artifacts_used(views)
    assert used == {DIGEST: ["chat", "smol"], "x": ["chat"]}
    manifest = ArtifactManifest.model_validate(
        {"files": [{"path": "model.gguf", "digest": DIGEST, "size": 10}], "source": "ollama:s"}
    )
    (row, gone) = artifact_rows([("z", "sha256:00", "unreadable"), ("a", DIGEST, manifest)], used)
    assert (row.name, row.size, row.files, row.models) == ("a", 10, 1, ["chat", "smol"])
    assert (gone.name, gone.size, gone.problem) == ("z", None, "unreadable")
    status = FetchStatus(
        workflow_id="fetch-n",
        view=ArtifactFetchView(node="n", manifest=DIGEST, model="chat"),
        report=FetchProgressReport(done=1_000_000_000, total=4_000_000_000, note="fetching"),
        attempt=2,
        last_failure="connection reset",
    )
    (fetch,) = fetch_rows([status])
    assert (fetch.node, fetch.model, fetch.state) == ("n", "chat", "fetching")
    assert fetch.progress == "1.00 of 4.00 GB (25%)"
    assert "attempt 2, the last failed: connection reset" in fetch.detail


class ScriptedWindow:
    """A curses window's few calls the console makes, with keys pressed on cue."""

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.lines: list[str] = []

    def nodelay(self, flag: bool) -> None: ...
    def keypad(self, flag: bool) -> None: ...
    def erase(self) -> None:
        self.lines = []

    def getmaxyx(self) -> tuple[int, int]:
        return (12, 100)

    def addnstr(self, y: int, x: int, text: str, n: int) -> None:
        self.lines.append(text[:n])

    def refresh(self) -> None: ...
    def getch(self) -> int:
        return self.keys.pop(0) if self.keys else -1


class Source:
    def __init__(self) -> None:
        self.reads = 0

    async def read(self) -> TopData:
        self.reads += 1
        return data()


class Operator:
    def __init__(self) -> None:
        self.done: list[Action] = []

    async def run(self, action: Action, progress: Any) -> str:
        self.done.append(action)
        if action.verb == "scale":
            raise ActionRefused("replicas 500 is more than max_replicas 64")
        return f"node {action.target}: {action.verb} done"


async def until(window: ScriptedWindow, text: str) -> None:
    for _ in range(200):
        if any(text in line for line in window.lines):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{text!r} not drawn:\n" + "\n".join(window.lines))


async def test_the_console_runs_a_confirmed_action_and_shows_its_outcome() -> None:
    window, source, operator = ScriptedWindow(), Source(), Operator()
    running = asyncio.create_task(console(window, source, 60.0, operator))
    await until(window, "gpu-a")
    window.keys += [curses.KEY_DOWN, ord("c"), *b"maint", ENTER]
    await until(window, "node gpu-b: cordon done")
    assert operator.done == [Action("cordon", "gpu-b", "maint")]
    for _ in range(100):  # read again after the action, not a minute later
        if source.reads >= 2:
            break
        await asyncio.sleep(0.01)
    assert source.reads >= 2
    window.keys += [9, 9, 9, ord("n"), *b"500", ENTER]
    await until(window, "scale refused: replicas 500 is more than max_replicas 64")
    window.keys.append(ord("q"))
    await asyncio.wait_for(running, 5)


class Cluster:
    """The model workflow's side of an import: definitions recorded, names answered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, defined: set[str]) -> None:
        self.specs: list[ModelSpec] = []
        self.defined = defined
        monkeypatch.setattr(console_cluster, "apply_model", self.apply)
        monkeypatch.setattr(console_cluster, "list_models", self.models)

    async def apply(self, client: object, spec: ModelSpec) -> None:
        self.specs.append(spec)

    async def models(self, client: object) -> list[ModelView]:
        return [ModelView(spec=ModelSpec(name=n, artifact=DIGEST)) for n in self.defined]


def import_kit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> tuple[LiveOperator, Cluster, Locations]:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\x01" * size)
    ollama_store(tmp_path / "ollama", gguf, {"temperature": 0.2})
    where = Locations(
        state_dir=tmp_path / "state",
        cache_dir=tmp_path / "cache",
        temporal="127.0.0.1:7233",
        namespace="default",
        database_url=None,
    )
    cluster = Cluster(monkeypatch, {"chat"})
    operator = LiveOperator(None, None, where, str(tmp_path / "ollama"))  # type: ignore[arg-type]
    return operator, cluster, where


async def test_the_ollama_import_defines_the_model_and_mirrors_it_as_the_console_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    operator, cluster, where = import_kit(tmp_path, monkeypatch, 3 * CHUNK)
    seen: list[str] = []
    # Refused in the web console's words, before anything is copied.
    for typed, words in [
        ("nosuch:7b", "ollama nosuch:7b: no model nosuch:7b"),
        ("smollm2:9b", "no tag '9b'"),
        ("smollm2:135m as Bad!", "invalid model: name"),
        ("smollm2:135m as chat", "a model named 'chat' is already defined"),
    ]:
        with pytest.raises(ActionRefused) as refused:
            await operator.run(Action("import", "", typed), seen.append)
        assert words in str(refused.value), str(refused.value)
    assert not where.models_dir.exists()
    assert not where.mirror_dir.exists()
    assert (cluster.specs, seen) == ([], [])

    said = await operator.run(Action("import", "", "smollm2:135m"), seen.append)
    assert said == (
        "imported ollama smollm2:135m: model smollm2-135m defined, in the mirror as smollm2-135m"
    )
    # The status line followed the copy into the models dir, then into the mirror, then the
    # definition.
    copying = [line for line in seen if ": copying model.gguf" in line]
    assert len(copying) >= 3
    assert copying[-1] == (
        "importing ollama smollm2:135m as model smollm2-135m: copying model.gguf 100% of 3.0 MiB"
    )
    assert any(": mirroring model.gguf 100%" in line for line in seen)
    assert seen[-1] == "importing ollama smollm2:135m as model smollm2-135m: defining"
    (spec,) = cluster.specs
    assert spec.name == "smollm2-135m"
    assert Path(spec.weights).parent == where.models_dir
    assert Path(spec.weights).is_file()
    assert spec.profiles[0].args == ["--temp", "0.2"]  # Ollama's params, as the CLI takes them
    ((name, _, manifest),) = mirror_entries(MirrorStore(where.mirror_dir))
    assert name == "smollm2-135m"
    assert not isinstance(manifest, str)
    assert manifest.source == "ollama:smollm2:135m"
    # Under a name of the operator's.
    await operator.run(Action("import", "", "smollm2:135m as smol"), seen.append)
    assert [s.name for s in cluster.specs] == ["smollm2-135m", "smol"]


async def test_quitting_during_an_import_stops_the_copy_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    operator, cluster, where = import_kit(tmp_path, monkeypatch, 3 * CHUNK)
    copying, release, ended = threading.Event(), threading.Event(), threading.Event()
    real = fetch_blobs  # what console_import calls, until the patch below

    def held(plan: ImportPlan, progress: BlobProgress) -> list[str]:
        def each(blob: Blob, done: int) -> None:
            progress(blob, done)
            copying.set()
            release.wait(10)

        try:
            return real(plan, each)
        finally:
            ended.set()

    monkeypatch.setattr(console_import, "fetch_blobs", held)
    running = asyncio.create_task(operator.run(Action("import", "", "smollm2:135m"), print))
    assert await asyncio.to_thread(copying.wait, 10)
    (partial,) = where.models_dir.iterdir()
    assert partial.name.endswith(".part")
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    release.set()
    assert await asyncio.to_thread(ended.wait, 10)
    assert list(where.models_dir.iterdir()) == []
    assert not where.mirror_dir.exists()
    assert cluster.specs == []


async def test_an_import_whose_definition_fails_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    operator, _, _ = import_kit(tmp_path, monkeypatch, 16)

    async def refuse(client: object, spec: ModelSpec) -> None:  # noqa: ARG001
        raise RuntimeError("the model workflow is gone")

    monkeypatch.setattr(console_cluster, "apply_model", refuse)
    with pytest.raises(ActionFailed, match="the definition was refused: the model workflow"):
        await operator.run(Action("import", "", "smollm2:135m"), print)
