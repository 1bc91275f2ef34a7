"""Whether a node has the disk for a model's weights. Pure.

A node that already holds the model's artifact (its hint is in the node's inventory) needs no
space: nothing is fetched. A node that must fetch it needs the artifact's size and a margin
free where its agent keeps artifacts, so the fetch cannot fill the disk the engines' logs and
the node's other files live on. The margin is a tenth of the size, at least DISK_MARGIN_MIN_MB.

What is not known refuses nothing: a model defined without a size (artifact_size 0: defined by
hand with a digest, or before sizes were recorded) or a node whose agent does not report its
free space (artifact_disk_free_mb None: an older agent, or a disk it could not read) is placed
as before this check existed. The free space is as the agent last reported it (it looks again
every minute or so); fetches that other replicas start meanwhile are not subtracted.

MB and GB are 10**6 and 10**9 bytes, as in the fetch's own messages (activities/agent/
artifact_fetch.py) and disk vendors' sizes.
"""

from __future__ import annotations

from workflows.artifact_names import artifact_hint
from workflows.contracts import NodeRecord

MB = 1_000_000
DISK_MARGIN_MIN_MB = 500
# The margin is 1/DISK_MARGIN_DIVISOR of the artifact's size when that is more.
DISK_MARGIN_DIVISOR = 10


def holds(node: NodeRecord, artifact: str) -> bool:
    """The node reports the artifact whole (activities/agent/artifact_store.py)."""
    return bool(artifact) and artifact_hint(artifact) in node.inventory.artifacts


def must_fetch(node: NodeRecord, artifact: str) -> bool:
    return bool(artifact) and not holds(node, artifact)


def needed_mb(size: int) -> int:
    """Free disk a fetch of `size` bytes needs: the size rounded up, and the margin."""
    size_mb = -(-size // MB)
    return size_mb + max(DISK_MARGIN_MIN_MB, -(-size_mb // DISK_MARGIN_DIVISOR))


def size_text(mb: int, up: bool = False) -> str:
    """Like "640 MB", "1.2 GB", "15 GB": whole numbers where the precision is not needed, so
    the ledger's refusal summary (refusal.py) can group nodes whose numbers differ. Rounded
    down, or `up`: what is needed is rounded up and what is free down, so that a refusal never
    reads "needs 1.5 GB, 1.5 GB free"."""
    if mb < 1000:
        return f"{mb} MB"
    if mb < 10_000:
        tenths = -(-mb // 100) if up else mb // 100
        return f"{tenths // 10}.{tenths % 10} GB"
    return f"{-(-mb // 1000) if up else mb // 1000} GB"


def disk_problem(node: NodeRecord, artifact: str, size: int) -> str | None:
    """Why this node cannot fetch the weights for lack of space, or None: it holds them, it has
    the space, or the size or its free space is not known."""
    free = node.inventory.artifact_disk_free_mb
    if not size or free is None or not must_fetch(node, artifact):
        return None
    wanted = needed_mb(size)
    if free >= wanted:
        return None
    return f"needs {size_text(wanted, up=True)} of disk for the weights, {size_text(free)} free"
