"""`llmgw mirror add|ls|rm|gc|serve`: the control plane's model mirror from the command line
(activities/control/mirror/, docs/models.md). It works on the state dir's files directly,
with no Temporal; `serve` answers the node agents' fetches (workers/mirror_serve.py)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable
from typing import TextIO

from activities.control.mirror.add import Added, add_source
from activities.control.mirror.errors import MirrorError
from activities.control.mirror.gc import DEFAULT_TMP_AGE_S, GcPlan, collect
from activities.control.mirror.huggingface import token_from_options
from activities.control.mirror.sources import BadSource, OllamaSource, parse_source
from activities.control.mirror.store import MirrorStore
from workers.paths import Locations
from workers.tables import table
from workers.verbosity import add_verbose_argument
from workflows.artifact_names import BadArtifact
from workflows.contracts import ArtifactManifest, ModelView

MIRROR_COMMAND = "mirror"
MIB = 1 << 20
# Without a total, a line every this many bytes.
UNKNOWN_TOTAL_STEP = 256 * MIB


def add_mirror_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Only the state dir: the mirror needs no Temporal address and no database.
    local = argparse.ArgumentParser(add_help=False)
    local.add_argument("--state-dir", help="default $LLMGW_STATE_DIR or ~/.local/state/llmgw")
    add_verbose_argument(local)
    mirror = sub.add_parser(MIRROR_COMMAND, help="the control plane's model mirror (sha256)")
    msub = mirror.add_subparsers(dest="action", required=True)
    add = msub.add_parser(
        "add",
        parents=[local],
        help="add a file, directory, URL, hf://ORG/REPO[@REV][/FILE,...] or ollama://NAME[:TAG]",
    )
    add.add_argument(
        "source", metavar="SOURCE", help="PATH, URL[#sha256=HEX], hf://... or ollama://NAME[:TAG]"
    )
    add.add_argument("--name", help="the mirror's name for it (default: from the source)")
    add_source_options(add)
    msub.add_parser("ls", parents=[local], help="names with their digest, size and source")
    rm = msub.add_parser("rm", parents=[local], help="remove a name (gc frees its files)")
    rm.add_argument("name")
    gc = msub.add_parser(
        "gc", parents=[local], help="remove what no name references, and stale partials"
    )
    gc.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    gc.add_argument(
        "--tmp-older-than",
        type=float,
        default=DEFAULT_TMP_AGE_S / 3600,
        metavar="HOURS",
        help="remove partial downloads left this long (default 24; 0: all)",
    )
    serve = msub.add_parser(
        "serve", parents=[local], help="serve the mirror to node agents (they fetch with --mirror)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8004)


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """How a SOURCE is read: for `mirror add` and `model add --from`."""
    parser.add_argument("--sha256", metavar="HEX", help="the digest a downloaded file must have")
    parser.add_argument(
        "--hf-endpoint",
        default=os.environ.get("HF_ENDPOINT"),
        metavar="URL",
        help="Hugging Face-layout endpoint (default $HF_ENDPOINT or https://huggingface.co)",
    )
    token = parser.add_mutually_exclusive_group()
    token.add_argument(
        "--hf-token-env", metavar="VAR", help="the environment variable holding the token"
    )
    token.add_argument("--hf-token-file", metavar="FILE", help="the file holding the token")
    parser.add_argument(
        "--ollama-store", metavar="DIR", help="Ollama's store (default $OLLAMA_MODELS)"
    )


class ProgressLines:
    """Progress as lines on stderr: one per 5% of a file (or per 256 MiB when its size is
    unknown), so a log of the command stays readable."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.last: dict[str, int] = {}

    def __call__(self, what: str, done: int, total: int | None) -> None:
        step = done * 20 // total if total else done // UNKNOWN_TOTAL_STEP
        if self.last.get(what) == step:
            return
        self.last[what] = step
        if total:
            line = f"{what}: {done * 100 // total}% ({human(done)} of {human(total)})"
        else:
            line = f"{what}: {human(done)}"
        print(line, file=self.out, flush=True)


def human(n: int) -> str:
    """A byte count for people: bytes below a KiB, then KiB, MiB or GiB."""
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def run_mirror_command(args: argparse.Namespace, where: Locations) -> None:
    # httpx logs every request's URL at INFO, user name, password and signed query included:
    # the mirror never lets a credential reach a log line, and prints its own progress.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.action == "serve":
        from workers.mirror_serve import main as serve_main

        serve_main(where, args.host, args.port)
        return
    store = MirrorStore(where.mirror_dir)
    try:
        if args.action == "add":
            show_added(mirror_add(store, args))
        elif args.action == "ls":
            print(mirror_ls(store))
        elif args.action == "rm":
            if not store.remove_ref(args.name):
                raise SystemExit(f"mirror rm: no name {args.name!r} in the mirror")
            print(f"removed {args.name}; `llmgw mirror gc` frees files nothing else references")
        elif args.action == "gc":
            plan = collect(store, args.tmp_older_than * 3600, args.dry_run)
            print(describe_gc(plan, args.dry_run))
    except (MirrorError, BadSource, BadArtifact) as err:
        raise SystemExit(f"mirror {args.action}: {err}") from None


def mirror_add(
    store: MirrorStore, args: argparse.Namespace, name: str | None = None, text: str | None = None
) -> Added:
    """Add `text` (default args.source) under `name` (default args.name, else one made from
    the source), read as args' source options say."""
    source = parse_source(text or args.source, args.sha256, args.hf_endpoint)
    progress = ProgressLines(sys.stderr)
    name = name or getattr(args, "name", None)
    if isinstance(source, OllamaSource):
        from workers.ollama.mirror_add import add_ollama

        return add_ollama(store, source, args.ollama_store, name, progress)
    token = token_from_options(args.hf_token_env, args.hf_token_file)
    return add_source(store, source, name, token, progress)


def show_added(added: Added) -> None:
    new = f", {human(added.new_bytes)} new" if added.new_bytes else ", nothing new to store"
    print(f"{added.name}: {added.digest} ({human(added.manifest.size)}{new})")
    for f in added.manifest.files:
        print(f"  {f.path}  {f.digest}  {f.size} bytes")


# A name in the mirror, its manifest's digest, and the manifest or why it could not be read.
MirrorEntry = tuple[str, str, ArtifactManifest | str]


def mirror_entries(store: MirrorStore) -> list[MirrorEntry]:
    """Each name in the mirror with its manifest digest and its manifest, or why that could not
    be read: what `mirror ls`, `llmgw top`'s Mirror pane and the web console's mirror page
    show."""
    entries: list[MirrorEntry] = []
    for name, digest in store.refs().items():
        try:
            entries.append((name, digest, store.read_manifest(digest)))
        except MirrorError as err:
            entries.append((name, digest, str(err)))
    return entries


def artifacts_used(views: Iterable[ModelView]) -> dict[str, list[str]]:
    """Manifest digest -> the models whose weights or LoRA adapters are that artifact."""
    used: dict[str, set[str]] = {}
    for view in views:
        spec = view.spec
        digests = {spec.artifact} | {a.artifact for p in spec.profiles for a in p.lora}
        for digest in digests - {""}:
            used.setdefault(digest, set()).add(spec.name)
    return {digest: sorted(models) for digest, models in used.items()}


def mirror_ls(store: MirrorStore) -> str:
    rows = []
    for name, digest, manifest in mirror_entries(store):
        if isinstance(manifest, str):
            size, source = "?", manifest
        else:
            size, source = human(manifest.size), manifest.source
        rows.append([name, digest[: len("sha256:") + 16], size, source])
    if not rows:
        return "the mirror is empty (llmgw mirror add SOURCE)"
    return table(["NAME", "MANIFEST", "SIZE", "SOURCE"], rows)


def describe_gc(plan: GcPlan, dry_run: bool) -> str:
    verb = "would remove" if dry_run else "removed"
    lines = [
        f"{verb} {len(plan.manifests)} manifest(s), {len(plan.blobs)} blob(s), "
        f"{len(plan.partials)} partial download(s): {human(plan.freed)}"
    ]
    lines += [f"  manifest {d}" for d in plan.manifests]
    lines += [f"  blob {d}" for d in plan.blobs]
    lines += [f"  tmp/{n}" for n in plan.partials]
    lines += [f"warning: name {n} points to a missing manifest" for n in plan.dangling]
    return "\n".join(lines)
