"""Garbage collection: manifests no ref names, blobs no remaining manifest lists, and
partials in tmp/ left longer than a given age (an add still running holds the lock gc needs,
so what is left is a download someone may yet resume, hence the age).

`plan_gc` decides from plain data (pure, unit tested); `collect` reads the disk, plans, and
removes under the mirror's exclusive lock."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from activities.control.mirror.errors import MirrorError
from activities.control.mirror.store import MirrorStore

DEFAULT_TMP_AGE_S = 24 * 3600.0
_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Seen:
    """What the mirror holds, as gc needs it."""

    refs: dict[str, str]  # name -> manifest digest
    manifests: dict[str, list[str] | None]  # digest -> blob digests it lists (None: unreadable)
    blobs: dict[str, int]  # digest -> size
    manifest_sizes: dict[str, int] = field(default_factory=dict)
    tmp: dict[str, tuple[float, int]] = field(default_factory=dict)  # name -> (age s, size)


@dataclass(frozen=True)
class GcPlan:
    manifests: list[str]
    blobs: list[str]
    partials: list[str]
    freed: int  # bytes
    dangling: list[str]  # refs whose manifest is missing: reported, left alone


def plan_gc(seen: Seen, tmp_max_age_s: float) -> GcPlan:
    wanted = set(seen.refs.values())
    for name, digest in seen.refs.items():
        if digest in seen.manifests and seen.manifests[digest] is None:
            raise MirrorError(
                f"ref {name} names manifest {digest}, which cannot be read: gc would not know "
                "which blobs it needs, so it removes nothing"
            )
    manifests = sorted(d for d in seen.manifests if d not in wanted)
    kept_blobs = {b for d in wanted for b in (seen.manifests.get(d) or [])}
    blobs = sorted(b for b in seen.blobs if b not in kept_blobs)
    partials = sorted(n for n, (age, _) in seen.tmp.items() if age >= tmp_max_age_s)
    freed = (
        sum(seen.blobs[b] for b in blobs)
        + sum(seen.manifest_sizes.get(m, 0) for m in manifests)
        + sum(seen.tmp[p][1] for p in partials)
    )
    dangling = sorted(n for n, d in seen.refs.items() if d not in seen.manifests)
    return GcPlan(manifests, blobs, partials, freed, dangling)


def look(store: MirrorStore, now: float) -> Seen:
    manifests: dict[str, list[str] | None] = {}
    manifest_sizes = {}
    for path in store.manifests.glob("*.json"):
        if not _HEX.match(path.stem):
            continue
        digest = "sha256:" + path.stem
        manifest_sizes[digest] = path.stat().st_size
        try:
            manifests[digest] = [f.digest for f in store.read_manifest(digest).files]
        except MirrorError:
            manifests[digest] = None
    blobs = {
        "sha256:" + p.name: p.stat().st_size for p in store.blobs.iterdir() if _HEX.match(p.name)
    }
    tmp = {}
    for path in store.tmp.iterdir():
        info = path.stat()
        tmp[path.name] = (now - info.st_mtime, info.st_size)
    return Seen(store.refs(), manifests, blobs, manifest_sizes, tmp)


def collect(store: MirrorStore, tmp_max_age_s: float, dry_run: bool) -> GcPlan:
    with store.collecting():
        plan = plan_gc(look(store, time.time()), tmp_max_age_s)
        if dry_run:
            return plan
        # Manifests first: a crash half-way leaves blobs without a manifest (the next gc takes
        # them), never a manifest without its blobs.
        for digest in plan.manifests:
            store.manifest_path(digest).unlink(missing_ok=True)
        for digest in plan.blobs:
            store.blob_path(digest).unlink(missing_ok=True)
        for name in plan.partials:
            (store.tmp / name).unlink(missing_ok=True)
    return plan
