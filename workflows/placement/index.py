"""What placement reads of every node, kept between placements instead of rebuilt for each.

Rebuilding every node's usage from every allocation, and checking every node in full, cost
placement hundreds of milliseconds at 10,000 nodes. The ledger keeps one PlacementIndex for its
run: built once from its state when first needed, then told of each allocation placed or
released and of each node record that changes. It is never carried through continue-as-new
(the allocations are; the index is rebuilt from them), so it adds nothing to the ledger's state
or history, and a replay rebuilds the same index.

Per node it holds the usage of every shard on it (usage.py) and which replicas have a shard
there (so a release recounts only the nodes it touches); and it keeps the nodes in the orders
placement prefers them (place.py: the tightest GPU node first, the CPU node with the fewest
engines first), so a placement checks nodes from the front until one fits instead of all.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

from workflows.contracts import Allocation, LedgerState, NodeRecord
from workflows.placement.checks import unusable_reason
from workflows.placement.fabric import NodeFabrics, node_fabrics
from workflows.placement.usage import NodeUsage

EMPTY = NodeUsage()
# Distinct multi-node questions whose idle-node verdicts are kept (idle_verdict).
IDLE_QUESTIONS = 8
T = TypeVar("T", bound=tuple[Any, ...])


class PlacementIndex:
    """Reads `state` (the ledger's own, kept for its run): nodes and allocations change only
    through the ledger, which tells the index each time (add, remove, node_changed)."""

    def __init__(self, state: LedgerState, tiebreak: Callable[[str], str] | None = None) -> None:
        self._state = state
        # What orders nodes placement likes equally, before their names: the name itself by
        # default; a placer racing others gives its own order (activities/control/placer.py),
        # so racing placers fill different nodes of the same fleet.
        self.tiebreak: Callable[[str], str] = tiebreak or _same
        self.usage: dict[str, NodeUsage] = {}
        self._replicas_on: dict[str, set[str]] = {}
        # name -> GPU class -> usable GPU indices (checks.free_gpus without `used`)
        self._usable: dict[str, dict[str, tuple[int, ...]]] = {}
        self._fabrics: dict[str, NodeFabrics] = {}
        # name -> GPU class -> free usable GPUs; and per class, (free, tiebreak, name) sorted,
        # free > 0
        self._free: dict[str, dict[str, int]] = {}
        self._by_free: dict[str, list[tuple[int, str, str]]] = {}
        # name -> (engine processes, -free cores, tiebreak, name); and all of them sorted
        self._cpu_key: dict[str, tuple[int, int, str, str]] = {}
        self._by_cpu: list[tuple[int, int, str, str]] = []
        # What why_not said of a node nothing is placed on, by what it was asked (see
        # idle_verdict); the most recent few questions only.
        self._idle_verdicts: dict[Hashable, dict[str, bool]] = {}
        for alloc in state.allocations.values():
            for node in {s.node for s in alloc.shards_or_leader()}:
                self.usage.setdefault(node, NodeUsage()).add(alloc, node)
                self._replicas_on.setdefault(node, set()).add(alloc.replica_id)
        for name in state.nodes:
            self.node_changed(name)

    # --- told by the ledger ----------------------------------------------------------------

    def add(self, alloc: Allocation) -> None:
        """A new allocation: its shards now hold their cores, memory, ports and GPUs."""
        for node in {s.node for s in alloc.shards_or_leader()}:
            self.usage.setdefault(node, NodeUsage()).add(alloc, node)
            self._replicas_on.setdefault(node, set()).add(alloc.replica_id)
            self._reorder(node)

    def remove(self, alloc: Allocation) -> None:
        """A released allocation (already gone from the state): each node it was on is
        recounted from the allocations still there, so nothing is subtracted twice or left
        held when two allocations ever named the same port."""
        for node in {s.node for s in alloc.shards_or_leader()}:
            on = self._replicas_on.get(node, set())
            on.discard(alloc.replica_id)
            usage = NodeUsage()
            for replica in on:
                other = self._state.allocations.get(replica)
                if other is not None:
                    usage.add(other, node)
            if on:
                self.usage[node] = usage
            else:
                self.usage.pop(node, None)
                self._replicas_on.pop(node, None)
            self._reorder(node)

    def node_changed(self, name: str) -> None:
        """The node's record was replaced or removed: what is read of it is worked out again."""
        self._usable.pop(name, None)
        self._fabrics.pop(name, None)
        for verdicts in self._idle_verdicts.values():
            verdicts.pop(name, None)
        node = self._state.nodes.get(name)
        if node is not None:
            by_class: dict[str, list[int]] = {}
            for gpu in node.inventory.gpus:
                if not unusable_reason(gpu):
                    by_class.setdefault(gpu.gpu_class, []).append(gpu.index)
            self._usable[name] = {cls: tuple(found) for cls, found in by_class.items()}
        self._reorder(name)

    # --- read by placement -----------------------------------------------------------------

    def used(self, node: str) -> NodeUsage:
        return self.usage.get(node, EMPTY)

    def replicas_on(self, node: str) -> frozenset[str]:
        """The replicas with a shard on the node."""
        return frozenset(self._replicas_on.get(node, ()))

    def free_gpu_count(self, name: str, gpu_class: str) -> int:
        """len(checks.free_gpus(node, gpu_class, used)) for a node in the state."""
        return self._free.get(name, {}).get(gpu_class, 0)

    def fabrics(self, node: NodeRecord) -> NodeFabrics:
        name = node.inventory.name
        found = self._fabrics.get(name)
        if found is None:
            found = self._fabrics[name] = node_fabrics(node)
        return found

    def gpu_nodes(self, gpu_class: str, at_least: int) -> Iterator[tuple[int, str]]:
        """(free, name) of the nodes with at least `at_least` free usable GPUs of the class
        (and at least one), the fewest free first, then by tiebreak and name."""
        entries = self._by_free.get(gpu_class, [])
        start = bisect_left(entries, (max(at_least, 1), "", ""))
        for at in range(start, len(entries)):
            free, _, name = entries[at]
            yield free, name

    def cpu_nodes(self) -> list[tuple[int, int, str, str]]:
        """(engine processes, -free cores, tiebreak, name) of every node, in that order."""
        return self._by_cpu

    def idle_verdict(self, name: str, question: Hashable, check: Callable[[], bool]) -> bool:
        """check() for a node nothing is placed on, remembered by `question` (all a check of
        such a node depends on besides its record: the profile, the weights, their size).
        A multi-node placement checks every node with enough free GPUs, and on a large fleet
        most of those are idle: thousands of identical checks a placement otherwise."""
        verdicts = self._idle_verdicts.get(question)
        if verdicts is None:
            if len(self._idle_verdicts) >= IDLE_QUESTIONS:
                del self._idle_verdicts[next(iter(self._idle_verdicts))]
            verdicts = self._idle_verdicts[question] = {}
        found = verdicts.get(name)
        if found is None:
            found = verdicts[name] = check()
        return found

    # --- keeping the orders ----------------------------------------------------------------

    def _reorder(self, name: str) -> None:
        for cls, was in self._free.pop(name, {}).items():
            _discard(self._by_free.get(cls, []), (was, self.tiebreak(name), name))
        old = self._cpu_key.pop(name, None)
        if old is not None:
            _discard(self._by_cpu, old)
        node = self._state.nodes.get(name)
        if node is None:
            return
        used = self.used(name)
        if used is not EMPTY:
            for verdicts in self._idle_verdicts.values():
                verdicts.pop(name, None)
        counts = {
            cls: sum(1 for index in usable if index not in used.gpus)
            for cls, usable in self._usable.get(name, {}).items()
        }
        self._free[name] = counts
        for cls, count in counts.items():
            if count > 0:
                insort(self._by_free.setdefault(cls, []), (count, self.tiebreak(name), name))
        key = (used.shards, used.cpu_cores - node.inventory.cpu_cores, self.tiebreak(name), name)
        self._cpu_key[name] = key
        insort(self._by_cpu, key)


def _discard(entries: list[T], entry: T) -> None:
    at = bisect_left(entries, entry)
    if at < len(entries) and entries[at] == entry:
        del entries[at]


def _same(name: str) -> str:
    return name
