"""`llmgw model add|apply|import-ollama|list|scale|rm|why`: the catalog from the command line
and from YAML (import-ollama: workers/ollama/model_import.py).

A definition is checked here first (workflows/catalog.py) so a typo fails before anything is
sent, and again by the model workflow, which is what the admin API and other clients reach.

An external model's upstream API key never enters its spec (a spec is in workflow history,
which anyone with the Temporal UI reads): it is read from a file or an environment variable,
never the command line (workers/commands/upstream_key.py), and kept in the gateway's store.
"""

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from temporalio.client import Client, WorkflowUpdateFailedError

from activities.control.mirror.errors import MirrorError
from activities.control.mirror.sources import OllamaSource
from activities.control.mirror.store import MirrorStore
from store import open_store
from store.fleet import FleetTables
from workers.commands.mirror import add_source_options
from workers.commands.model_resources import show_resources
from workers.commands.upstream_key import key_from_entry, upstream_key_from_args
from workers.external_kv_args import add_external_kv_arguments, external_kv_from_args
from workers.model_from_source import lora_sources, mirrored_spec, with_source
from workers.ollama.mirror_add import add_ollama
from workers.ollama.model_import import fetch_blobs, plan_import
from workers.ollama.store import STORE_ENV, OllamaStoreError
from workers.paths import Locations
from workers.progress import fleet_tables, ledger_snapshot
from workers.tables import table
from workflows.catalog import EXTERNAL, CatalogError, validate_model
from workflows.contracts import LoraAdapter, ModelSpec, Profile
from workflows.contracts.engine_facts import LLAMACPP, engine_names
from workflows.model.client import (
    apply_model,
    describe_model,
    list_models,
    remove_model,
    scale_model,
)


@dataclass(frozen=True)
class Declared:
    """A model definition and, for an external model, the upstream key it was given."""

    spec: ModelSpec
    upstream_key: str | None = None


def absolute(path: str) -> str:
    """A path on a command line is relative to where the operator stands, not to the agent."""
    return str(Path(path).expanduser().absolute())


def pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} wants NAME=VALUE, got {value!r}")
        out[key] = rest
    return out


def spec_from_args(args: argparse.Namespace) -> ModelSpec:
    profile = Profile(
        engine=args.engine,
        engine_version=args.engine_version,
        gpu_class=args.gpu_class,
        gpus_per_node=args.gpus_per_node,
        tensor_parallel=args.tensor_parallel,
        pipeline_parallel=args.pipeline_parallel,
        nodes=args.nodes,
        cpu_cores=args.cpu_cores,
        memory_mb=args.memory_mb,
        context_size=args.context_size,
        parallel=args.parallel,
        quantization=args.quantization,
        args=args.arg,
        env=pairs(args.env, "--env"),
        kv_events=args.kv_events,
        lora=[
            *(LoraAdapter(name=n, path=absolute(p)) for n, p in pairs(args.lora, "--lora").items()),
            *(LoraAdapter(name=n, path="") for n in lora_sources(args)),
        ],
        launch=args.launch,
        urls=args.url,
        upstream_model=args.upstream_model,
        external_kv=external_kv_from_args(args),
    )
    from_source = bool(getattr(args, "source", None))
    spec = ModelSpec(
        name=args.name,
        weights=absolute(args.weights) if args.weights and not from_source else "",
        replicas=args.replicas,
        min_replicas=args.min_replicas,
        max_replicas=max(args.max_replicas, args.replicas),
        profiles=[profile],
    )
    if from_source or lora_sources(args):
        return checked(with_source(spec, args.weights, from_source, lora_sources(args)))
    return checked(spec)


def checked(spec: ModelSpec) -> ModelSpec:
    try:
        validate_model(spec)
    except CatalogError as err:
        raise SystemExit(f"invalid model: {err}") from None
    return spec


def models_from_file(path: Path) -> list[Declared]:
    """`models:` (or a bare list) of model definitions, each checked; errors name the model and
    the field. An external model may name its key with `upstream_key_file:` (relative to the
    YAML file) or `upstream_key_env:`."""
    try:
        raw: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise SystemExit(f"{path}: {err}") from None
    if isinstance(raw, dict):
        raw = raw.get("models")
    if not isinstance(raw, list):
        raise SystemExit(f"{path}: expected `models:` with a list of model definitions")
    specs = []
    for i, entry in enumerate(raw):
        where = f"{path}: models[{i}]" + (
            f" ({entry.get('name')})" if isinstance(entry, dict) else ""
        )
        key = None
        if isinstance(entry, dict):
            entry = dict(entry)
            key = key_from_entry(entry, path.parent, where)
        try:
            spec = ModelSpec.model_validate(entry)
        except ValidationError as err:
            lines = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
            raise SystemExit(f"{where}: " + "; ".join(lines)) from None
        if key is not None and not spec.external:
            raise SystemExit(f"{where}: an upstream key is for engine {EXTERNAL} only")
        if spec.weights and not spec.artifact and not Path(spec.weights).is_absolute():
            spec.weights = str((path.parent / spec.weights).absolute())
        try:
            validate_model(spec)
        except CatalogError as err:
            raise SystemExit(f"{where}: {'; '.join(err.problems)}") from None
        specs.append(Declared(spec, key))
    names = [d.spec.name for d in specs]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: a model is defined twice")
    return specs


async def set_upstream_key(where: Locations, model: str, key: str | None) -> None:
    """Keep (or, with None, delete) the key the gateway sends to an external model."""
    store = open_store(where.database_url, where.state_dir)
    await store.init()
    try:
        await store.set_upstream_key(model, key)
    except ValueError as err:
        raise SystemExit(f"model {model}: {err}") from None
    finally:
        await store.close()


async def apply_declared(client: Client, where: Locations, declared: Declared) -> None:
    # The key first: the model's routes must not reach gateways before the key they need.
    if declared.upstream_key is not None:
        await set_upstream_key(where, declared.spec.name, declared.upstream_key)
    view = await apply_model(client, declared.spec)
    print(f"model {view.spec.name}: {wanted(view.spec)}")


def wanted(spec: ModelSpec) -> str:
    if spec.external:
        return f"{len(spec.profiles[0].urls)} external endpoint(s)"
    return f"{spec.replicas} replica(s) wanted"


async def model_command(
    args: argparse.Namespace,
    client: Client,
    where: Locations | None = None,
    fleet: FleetTables | None = None,
) -> None:
    if where is None:
        where = Locations.resolve(
            getattr(args, "state_dir", None),
            getattr(args, "temporal", None),
            getattr(args, "database_url", None),
        )
    try:
        if args.action == "add":
            spec = spec_from_args(args)
            if args.source or lora_sources(args):
                spec = checked(mirrored_spec(where, args, spec))
            await apply_declared(client, where, Declared(spec, upstream_key_from_args(args)))
        elif args.action == "apply":
            for declared in models_from_file(Path(args.file)):
                await apply_declared(client, where, declared)
        elif args.action == "import-ollama":
            await import_ollama(client, where, args)
        elif args.action == "scale":
            view = await scale_model(client, args.name, args.replicas)
            print(f"model {view.spec.name}: {view.spec.replicas} replica(s) wanted")
        elif args.action == "rm":
            before = await describe_model(client, args.name)
            await remove_model(client, args.name)
            if before is not None and before.spec.external:
                await set_upstream_key(where, args.name, None)
                print(f"model {args.name}: removing; its routes go and its upstream key is deleted")
            else:
                print(f"model {args.name}: removing; its replicas stop and release their resources")
        elif args.action == "list":
            await show_models(client, fleet or await fleet_tables(where))
        elif args.action == "why":
            await why(client, fleet or await fleet_tables(where), args.name)
        elif args.action == "resources":
            await show_resources(fleet or await fleet_tables(where), args.name)
    except WorkflowUpdateFailedError as err:
        raise SystemExit(f"refused: {err.cause}") from None


async def import_ollama(client: Client, where: Locations, args: argparse.Namespace) -> None:
    """Copy a model Ollama has pulled into the state dir, verified, and define it as `add`
    does. The definition is built and checked before anything is copied."""
    try:
        plan = plan_import(args, where.models_dir, pairs(args.env, "--env"))
        checked(plan.spec)
        print(f"ollama {plan.found.reference}: {plan.found.manifest}")
        # Synchronous on purpose: Ctrl-C stops a copy of gigabytes between two chunks, and
        # the temporary file goes with it.
        for line in fetch_blobs(plan):
            print(f"  {line}")
        if getattr(args, "mirror", False):
            print(f"  {mirror_ollama_model(where, args, plan.spec.name)}")
    except (OllamaStoreError, MirrorError, OSError) as err:
        raise SystemExit(f"import-ollama {args.reference}: {err}") from None
    for note in plan.notes:
        print(f"  {note}")
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    await apply_declared(client, where, Declared(plan.spec))


def mirror_ollama_model(where: Locations, args: argparse.Namespace, name: str) -> str:
    """`import-ollama --mirror`: the same Ollama model also into the control plane's mirror,
    under the model's name (docs/models.md), for nodes to fetch once they can."""
    added = add_ollama(
        MirrorStore(where.mirror_dir), OllamaSource(args.reference), args.store, name
    )
    return f"mirror: {added.name} -> {added.digest} ({len(added.manifest.files)} file(s))"


async def show_models(client: Client, fleet: FleetTables) -> None:
    state = await ledger_snapshot(fleet)
    rows = []
    for view in await list_models(client):
        routes = [r for r in state.routes.values() if r.model == view.spec.name]
        ready = sum(1 for r in routes if r.state.value == "ready")
        profiles = ", ".join(describe_profile(p) for p in view.spec.profiles)
        rows.append(
            [
                view.spec.name,
                profiles,
                str(view.spec.replicas),
                str(ready),
                str(len(view.stale)) if view.stale else "-",
                view.spec.weights or "-",
            ]
        )
    print(table(["MODEL", "PROFILES", "WANTED", "READY", "STALE", "WEIGHTS"], rows))


def describe_profile(p: Profile) -> str:
    if p.engine == EXTERNAL:
        named = f" as {p.upstream_model}" if p.upstream_model else ""
        events = ", KV events" if p.external_kv is not None else ""
        return f"{EXTERNAL} {' '.join(p.urls)}{named}{events}"
    where = "cpu" if p.gpu_class is None else f"{p.gpu_class} x{p.gpus_per_node}"
    if p.nodes > 1:
        where += f" x{p.nodes} nodes"
    return f"{p.engine} {where}"


async def why(client: Client, fleet: FleetTables, name: str) -> None:
    """Where each profile of the model could go now, and why every other node is out: for
    weights in the mirror, also which nodes hold them and which lack the disk to fetch them."""
    from workflows.placement import explain

    views = [v for v in await list_models(client) if v.spec.name == name]
    if not views:
        raise SystemExit(f"no model {name!r}")
    state = await ledger_snapshot(fleet)
    for line in explain(state, views[0].spec):
        print(line)
    pending = [r for r in state.routes.values() if r.model == name and r.state.value == "pending"]
    for route in sorted(pending, key=lambda r: r.replica_id):
        print(f"{route.replica_id} is pending: {route.detail}")


def add_model_parsers(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]",
    common: argparse.ArgumentParser,
) -> None:
    model = sub.add_parser("model", help="define, scale and remove models")
    msub = model.add_subparsers(dest="action", required=True)
    add = msub.add_parser("add", parents=[common], help="define a model (or change it)")
    add.add_argument("name")
    add.add_argument(
        "--weights",
        help="GGUF file or model directory on the nodes; with --from, the file inside the "
        "source to run (default: its only file, or only GGUF file for llamacpp)",
    )
    add.add_argument(
        "--from",
        dest="source",
        metavar="SOURCE",
        help="take the weights into the control plane's mirror from a file, directory, URL, "
        "hf://ORG/REPO[@REV][/FILE,...] or ollama://NAME[:TAG]; each node fetches them from "
        "`llmgw mirror serve` (run this where the mirror is)",
    )
    add_source_options(add)
    add.add_argument("--replicas", type=int, default=1)
    add.add_argument("--min-replicas", type=int, default=0)
    add.add_argument("--max-replicas", type=int, default=64)
    add.add_argument(
        "--engine",
        default=LLAMACPP,
        help=f"one of {', '.join(engine_names())} ({EXTERNAL}: an OpenAI-compatible server "
        "llmgw does not run)",
    )
    add.add_argument("--engine-version", default="")
    add.add_argument("--gpu-class", help="e.g. h100-80g; omit for the CPU")
    add.add_argument("--gpus-per-node", type=int, default=0)
    add.add_argument("--tensor-parallel", "--tp", type=int, default=1)
    add.add_argument("--pipeline-parallel", "--pp", type=int, default=1)
    add.add_argument("--nodes", type=int, default=1)
    add.add_argument("--cpu-cores", type=int, default=2)
    add.add_argument("--memory-mb", type=int, default=1024)
    add.add_argument("--context-size", type=int, default=4096)
    add.add_argument("--parallel", type=int, default=2)
    add.add_argument("--quantization", default="")
    add.add_argument("--launch", default="mp", choices=["mp", "ray"])
    add.add_argument("--kv-events", action="store_true")
    add.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    add.add_argument("--lora", action="append", default=[], metavar="NAME=PATH")
    add.add_argument(
        "--lora-from",
        action="append",
        default=[],
        metavar="NAME=SOURCE",
        help="a LoRA adapter taken into the mirror from SOURCE (as --from), fetched by each node "
        "with the weights",
    )
    add.add_argument("--arg", action="append", default=[], help="extra engine argument")
    add.add_argument(
        "--url",
        action="append",
        default=[],
        help="--engine external: the server's base URL; repeat it, one replica per URL",
    )
    add.add_argument(
        "--upstream-model",
        default="",
        metavar="NAME",
        help="--engine external: the name the server knows the model by (sent in place of NAME)",
    )
    add_external_kv_arguments(add)
    # No flag takes the key itself: a command line lands in shell history and `ps`.
    key = add.add_mutually_exclusive_group()
    key.add_argument(
        "--upstream-key-file", metavar="FILE", help="--engine external: a file holding its API key"
    )
    key.add_argument(
        "--upstream-key-env",
        metavar="VAR",
        help="--engine external: an environment variable holding its API key",
    )
    apply = msub.add_parser("apply", parents=[common], help="define the models in a YAML file")
    apply.add_argument("-f", "--file", required=True)
    add_import_parser(msub, common)
    msub.add_parser("list", parents=[common], help="models and their replicas")
    scale = msub.add_parser("scale", parents=[common], help="set a model's replica count")
    scale.add_argument("name")
    scale.add_argument("replicas", type=int)
    rm = msub.add_parser("rm", parents=[common], help="remove a model and stop its replicas")
    rm.add_argument("name")
    why_cmd = msub.add_parser("why", parents=[common], help="where the model can go, and why not")
    why_cmd.add_argument("name")
    resources = msub.add_parser(
        "resources",
        parents=[common],
        help="memory, GPU memory and cores reserved for each replica beside what it uses",
    )
    resources.add_argument("name", nargs="?", help="one model (default: all)")


def add_import_parser(
    msub: "argparse._SubParsersAction[argparse.ArgumentParser]",
    common: argparse.ArgumentParser,
) -> None:
    imp = msub.add_parser(
        "import-ollama",
        parents=[common],
        help="serve a model Ollama has pulled: its GGUF copied (verified) into the state dir "
        "and defined on llama.cpp",
    )
    imp.add_argument("reference", metavar="NAME[:TAG]", help="as `ollama list` shows it")
    imp.add_argument(
        "--store",
        metavar="DIR",
        help=f"Ollama's models directory (default ${STORE_ENV} or ~/.ollama/models)",
    )
    imp.add_argument(
        "--as",
        dest="as_name",
        metavar="MODEL",
        help="the llmgw model's name (default: the Ollama name, ':' and '/' as '-')",
    )
    imp.add_argument(
        "--mirror",
        action="store_true",
        help="also add the model to the control plane's mirror under its name (docs/models.md)",
    )
    imp.add_argument("--replicas", type=int, default=1)
    imp.add_argument("--min-replicas", type=int, default=0)
    imp.add_argument("--max-replicas", type=int, default=64)
    imp.add_argument("--engine-version", default="")
    imp.add_argument("--gpu-class", help="e.g. h100-80g; omit for the CPU")
    imp.add_argument("--gpus-per-node", type=int, default=0)
    imp.add_argument("--cpu-cores", type=int, default=2)
    imp.add_argument(
        "--memory-mb",
        type=int,
        help="default: on the CPU the weights' size + 512, at least 1024; on GPUs 1024",
    )
    imp.add_argument("--context-size", type=int, help="default: Ollama's num_ctx, else 4096")
    imp.add_argument("--parallel", type=int, default=2)
    imp.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    imp.add_argument(
        "--arg", action="append", default=[], help="extra llama-server argument (after Ollama's)"
    )
    imp.add_argument(
        "--no-params",
        action="store_true",
        help="leave Ollama's parameters (stop words, temperature, ...) out of the profile",
    )
