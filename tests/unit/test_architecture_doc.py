"""docs/architecture.md's workflow table against the code: every `@workflow.defn` class in the
workflows package, with its type name and its signals, updates and queries, and the workflow
IDs workflows/names.py makes.

Workflow classes are found by importing every module of the package, so moving a class to
another module changes nothing here. The handler names come from the definition the SDK's
`@workflow.defn` attaches to the class: the Python SDK has no public way to list them outside a
running workflow, and `_Definition.from_class` is what its own worker uses.

The rest of the page is held too: it stays a map of at most MAX_LINES lines, every path it
names exists, its folder table lists every top-level package (and no folder that is gone), and
its links, and every link into it from the other docs and the README, reach a file and heading
that exist.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from temporalio import workflow

import workflows
from workflows import names

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
COLUMNS = ("workflow class", "type", "id", "signals", "updates", "queries")
MESSAGE_KINDS = ("signals", "updates", "queries")
# How the table writes a dynamic handler (one registered without a name).
DYNAMIC = "*"
# A placeholder in an ID: `<node>`, `<time>`. Compared without its name, so renaming a
# parameter in names.py does not fail the test.
_PLACEHOLDER = re.compile(r"<[^<>]*>")
# Temporal appends the scheduled time to the ID of a workflow a schedule starts.
SCHEDULED_SUFFIX = "-<time>"


@dataclass(frozen=True)
class Row:
    """One workflow, as the table writes it or as the code defines it."""

    class_name: str
    type_name: str
    ids: tuple[str, ...]
    signals: frozenset[str]
    updates: frozenset[str]
    queries: frozenset[str]

    def messages(self, kind: str) -> frozenset[str]:
        found: frozenset[str] = getattr(self, kind)
        return found


# --- the document ---------------------------------------------------------------------------


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _names(cell: str, where: str) -> tuple[str, ...]:
    """The backticked names in a cell; "—" (or nothing) for none. Text outside backticks other
    than commas and dashes is an error, so a name written without backticks is not lost."""
    found = tuple(re.findall(r"`([^`]+)`", cell))
    rest = re.sub(r"`[^`]*`", "", cell)
    if rest.strip(" ,\u2014\u2013-"):  # commas, em and en dashes, hyphens
        raise AssertionError(f"{where}: {cell!r} holds text outside backticks: {rest.strip()!r}")
    return found


def parse_table(text: str) -> list[Row]:
    """The rows of the one table in `text` whose header is COLUMNS."""
    lines = text.splitlines()
    starts = [
        i
        for i, line in enumerate(lines)
        if line.lstrip().startswith("|") and tuple(cell.lower() for cell in _cells(line)) == COLUMNS
    ]
    assert len(starts) == 1, (
        f"expected one table headed | {' | '.join(COLUMNS)} | in docs/architecture.md, "
        f"found {len(starts)}"
    )
    rows: list[Row] = []
    for number, line in enumerate(lines[starts[0] + 2 :], start=starts[0] + 3):
        if not line.lstrip().startswith("|"):
            break
        cells = _cells(line)
        where = f"docs/architecture.md line {number}"
        assert len(cells) == len(COLUMNS), f"{where}: {len(cells)} cells, not {len(COLUMNS)}"
        class_cell, type_cell, id_cell, *message_cells = cells
        (class_name,) = _names(class_cell, where) or ("",)
        (type_name,) = _names(type_cell, where) or ("",)
        assert class_name, f"{where}: no workflow class name"
        assert type_name, f"{where}: no workflow type name"
        signals, updates, queries = (frozenset(_names(c, where)) for c in message_cells)
        rows.append(Row(class_name, type_name, _names(id_cell, where), signals, updates, queries))
    assert rows, "the workflow table in docs/architecture.md has no rows"
    return rows


# --- the code -------------------------------------------------------------------------------


def _handler_names(handlers: Mapping[str | None, object]) -> frozenset[str]:
    return frozenset(DYNAMIC if name is None else name for name in handlers)


def code_workflows() -> list[Row]:
    """Every workflow class defined in the workflows package, whatever module it lives in."""
    seen: dict[type, Row] = {}
    modules = [workflows.__name__]
    modules += [m.name for m in pkgutil.walk_packages(workflows.__path__, workflows.__name__ + ".")]
    for module_name in modules:
        module = importlib.import_module(module_name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            definition = workflow._Definition.from_class(cls)
            # A client's view of a workflow (workflows/model/api.py) is no workflow of its own.
            if definition is None or cls in seen or cls.__name__.endswith("Api"):
                continue
            seen[cls] = Row(
                class_name=cls.__name__,
                type_name=definition.name or DYNAMIC,
                ids=(),
                signals=_handler_names(definition.signals),
                updates=_handler_names(definition.updates),
                queries=_handler_names(definition.queries),
            )
    rows = list(seen.values())
    assert rows, "found no @workflow.defn class in the workflows package"
    return rows


def _shape(workflow_id: str) -> str:
    return _PLACEHOLDER.sub("<>", workflow_id)


def id_shapes() -> dict[str, str]:
    """Every workflow ID names.py makes, shape -> how it reads: its *_WORKFLOW_ID constants
    as they are, and its *_workflow_id functions called with `<parameter>` for each argument.
    A function that will not take placeholders is left out, and its ID then fails to match."""
    shapes: dict[str, str] = {}
    for attr, value in vars(names).items():
        if attr.endswith("_WORKFLOW_ID") and isinstance(value, str):
            shapes[_shape(value)] = value
        elif attr.endswith("_workflow_id") and inspect.isfunction(value):
            params = inspect.signature(value).parameters
            try:
                made = value(*(f"<{p}>" for p in params))
            except (TypeError, ValueError):  # will not take a string for each argument
                continue
            if isinstance(made, str):
                shapes[_shape(made)] = made
    return shapes


# --- the comparisons ------------------------------------------------------------------------


def _listed(values: frozenset[str]) -> str:
    return ", ".join(sorted(values)) or "—"


def differences(doc: list[Row], code: list[Row]) -> list[str]:
    """What differs between the table's rows and the code's workflows, one line each."""
    problems: list[str] = []
    documented: dict[str, Row] = {}
    for row in doc:
        if row.type_name in documented:
            problems.append(f"workflow type {row.type_name} has more than one row")
        documented[row.type_name] = row
    defined = {row.type_name: row for row in code}
    for type_name in sorted(defined.keys() - documented.keys()):
        row = defined[type_name]
        problems.append(
            f"workflow type {type_name} ({row.class_name}) is in the code but not in the table"
        )
    for type_name in sorted(documented.keys() - defined.keys()):
        problems.append(f"workflow type {type_name} is in the table but not in the code")
    for type_name in sorted(documented.keys() & defined.keys()):
        written, actual = documented[type_name], defined[type_name]
        if written.class_name != actual.class_name:
            problems.append(
                f"{type_name}: the table names class {written.class_name}, "
                f"the code {actual.class_name}"
            )
        for kind in MESSAGE_KINDS:
            said, real = written.messages(kind), actual.messages(kind)
            if said != real:
                problems.append(
                    f"{type_name} {kind}: the table lists {_listed(said)}, the code has "
                    f"{_listed(real)} (missing from the table: {_listed(real - said)}; "
                    f"not in the code: {_listed(said - real)})"
                )
    return problems


def id_differences(doc: list[Row], shapes: Mapping[str, str]) -> list[str]:
    """IDs in the table that names.py does not make, and IDs names.py makes that no row has."""
    problems: list[str] = []
    used: set[str] = set()
    for row in doc:
        if not row.ids:
            problems.append(f"{row.type_name}: no workflow ID in the table")
        for written in row.ids:
            shape = _shape(written)
            if shape not in shapes and written.endswith(SCHEDULED_SUFFIX):
                # A schedule's run: names.py gives the ID, Temporal appends the time.
                shape = _shape(written.removesuffix(SCHEDULED_SUFFIX))
            if shape in shapes:
                used.add(shape)
            else:
                problems.append(
                    f"{row.type_name}: ID {written} is not one workflows/names.py makes "
                    f"({', '.join(sorted(shapes.values()))})"
                )
    for shape in sorted(shapes.keys() - used):
        problems.append(f"workflows/names.py makes ID {shapes[shape]}, which no row shows")
    return problems


# --- the tests ------------------------------------------------------------------------------


def test_the_workflow_table_lists_every_workflow_and_its_messages() -> None:
    problems = differences(parse_table(DOC.read_text()), code_workflows())
    assert not problems, "docs/architecture.md's workflow table is out of date:\n" + "\n".join(
        problems
    )


def test_the_workflow_table_shows_the_ids_names_py_makes() -> None:
    problems = id_differences(parse_table(DOC.read_text()), id_shapes())
    assert not problems, "docs/architecture.md's workflow IDs are out of date:\n" + "\n".join(
        problems
    )


def _doctored(edit: str) -> list[Row]:
    """The table with one row added (`edit` is the row) or, given "", its first row dropped."""
    lines = DOC.read_text().splitlines()
    header = next(
        i
        for i, line in enumerate(lines)
        if line.lstrip().startswith("|") and tuple(cell.lower() for cell in _cells(line)) == COLUMNS
    )
    first_row = header + 2
    if edit:
        lines.insert(first_row, edit)
    else:
        del lines[first_row]
    return parse_table("\n".join(lines))


def test_a_made_up_row_is_caught() -> None:
    fake = "| `GhostWorkflow` | `Ghost` | `ghost:<name>` | `boo` | — | — |"
    problems = differences(_doctored(fake), code_workflows())
    assert any("Ghost" in p and "not in the code" in p for p in problems), problems
    assert any("ghost:<name>" in p for p in id_differences(_doctored(fake), id_shapes()))


def test_a_dropped_row_is_caught() -> None:
    dropped = parse_table(DOC.read_text())[0]
    problems = differences(_doctored(""), code_workflows())
    assert any(dropped.type_name in p and "not in the table" in p for p in problems), problems


def test_a_missing_or_extra_message_is_caught() -> None:
    code = code_workflows()
    with_messages = next(row for row in code if row.signals or row.updates or row.queries)
    kind = next(k for k in MESSAGE_KINDS if with_messages.messages(k))
    name = sorted(with_messages.messages(kind))[0]
    assert differences(code, code) == []
    altered = {k: set(with_messages.messages(k)) for k in MESSAGE_KINDS}
    altered[kind].discard(name)
    altered[kind].add("made_up")
    doc = [
        row
        if row is not with_messages
        else Row(
            row.class_name,
            row.type_name,
            row.ids,
            frozenset(altered["signals"]),
            frozenset(altered["updates"]),
            frozenset(altered["queries"]),
        )
        for row in code
    ]
    (problem,) = differences(doc, code)
    assert f"missing from the table: {name}" in problem
    assert "not in the code: made_up" in problem


# --- the rest of the map: its length, the code it names, its links ---------------------------

ROOT = DOC.parents[1]
# A map, not a manual: detail belongs in the doc of its part (issue 32).
MAX_LINES = 150
FOLDER_COLUMNS = ("folder", "what is there")
# The folders the folder table must list: every top-level package, and deploy/.
_PACKAGES = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists())
_LISTED_FOLDERS = [*_PACKAGES, "deploy"]
# A backticked name that is a path in the repository: it starts with one of its top folders.
_PATH = re.compile(
    r"`((?:" + "|".join(map(re.escape, [*_LISTED_FOLDERS, "docs"])) + r")/[^`\s<>*]*)`"
)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `#` in a block is no heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes for a Markdown text's headings: lower case, punctuation other
    than hyphens and underscores dropped, spaces as hyphens, `-1`, `-2` on repeats."""
    made: set[str] = set()
    for line in _prose(text):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading[1].lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in made:
            n += 1
            unique = f"{slug}-{n}"
        made.add(unique)
    return made


def missing_paths(text: str) -> list[str]:
    """Paths the text names that are not in the repository."""
    return sorted({p for p in _PATH.findall(text) if not (ROOT / p.rstrip("/")).exists()})


def folder_table(text: str) -> dict[str, str]:
    """The folder table's rows: folder -> what the row says is there."""
    lines = text.splitlines()
    (start,) = [
        i
        for i, line in enumerate(lines)
        if line.lstrip().startswith("|")
        and tuple(cell.lower() for cell in _cells(line)) == FOLDER_COLUMNS
    ]
    rows: dict[str, str] = {}
    for line in lines[start + 2 :]:
        if not line.lstrip().startswith("|"):
            break
        folder_cell, what = _cells(line)
        (folder,) = _names(folder_cell, "the folder table")
        rows[folder] = what
    return rows


def folder_problems(rows: Mapping[str, str]) -> list[str]:
    """Folders in the table that do not exist, top-level packages it leaves out, and bare file
    names in a row that are nowhere under the row's folder."""
    problems = [f"{folder} does not exist" for folder in rows if not (ROOT / folder).is_dir()]
    listed = {folder.split("/")[0] for folder in rows}
    for folder in _LISTED_FOLDERS:
        if folder not in listed:
            problems.append(f"{folder}/ is in the repository but not in the folder table")
    for folder, what in rows.items():
        for name in re.findall(r"`([\w.]+\.(?:py|yaml))`", what):
            if (ROOT / folder).is_dir() and not any((ROOT / folder).rglob(name)):
                problems.append(f"{folder} row names {name}, which is not under {folder}")
    return problems


def link_problems(text: str, source: Path) -> list[str]:
    """Relative links in `text` (a file in `source`'s folder) to a file that does not exist or
    to an anchor its target does not have."""
    problems: list[str] = []
    for link in _LINK.findall(text):
        if re.match(r"[a-z]+:", link):  # http:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (source.parent / target) if target else source
        if not path.exists():
            problems.append(f"{source.name}: link {link}: no file {target}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            problems.append(f"{source.name}: link {link}: {target or source.name} has no #{anchor}")
    return problems


def _links_into_the_map() -> list[str]:
    """Links from the other docs and the README to an anchor of docs/architecture.md."""
    problems: list[str] = []
    for source in [ROOT / "README.md", *sorted(DOC.parent.glob("*.md"))]:
        if source == DOC:
            continue
        into = "\n".join(
            f"]({link})"
            for link in _LINK.findall(source.read_text())
            if link.split("#")[0].endswith("architecture.md")
        )
        problems += link_problems(into, source)
    return problems


def test_the_map_fits_on_a_page() -> None:
    count = len(DOC.read_text().splitlines())
    assert count <= MAX_LINES, (
        f"docs/architecture.md is {count} lines, over {MAX_LINES}: move detail to the doc of its "
        "part and link to it"
    )


def test_every_path_the_map_names_exists() -> None:
    missing = missing_paths(DOC.read_text())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_folder_table_lists_every_package_and_only_what_exists() -> None:
    problems = folder_problems(folder_table(DOC.read_text()))
    assert not problems, "docs/architecture.md's folder table:\n" + "\n".join(problems)


def test_every_link_in_and_into_the_map_resolves() -> None:
    problems = link_problems(DOC.read_text(), DOC) + _links_into_the_map()
    assert not problems, "\n".join(problems)


def test_a_drifted_map_is_caught() -> None:
    assert missing_paths("see `gateway/no_such_module.py`") == ["gateway/no_such_module.py"]
    rows = {**folder_table(DOC.read_text()), "ghosts/": "nothing"}
    rows["engines/"] = "the adapters (`no_such_adapter.py`)"
    del rows["store/"]
    problems = folder_problems(rows)
    assert any("ghosts/ does not exist" in p for p in problems), problems
    assert any("store/ is in the repository" in p for p in problems), problems
    assert any("no_such_adapter.py" in p for p in problems), problems
    broken = link_problems("[a](nodes.md#no-such-heading) [b](no-such.md)", DOC)
    assert len(broken) == 2, broken
    headings = "## The retired `cluster` workflow\n## A replica's life\n## A replica's life"
    assert anchors(headings) == {
        "the-retired-cluster-workflow",
        "a-replicas-life",
        "a-replicas-life-1",
    }
