"""`llmgw node show`'s line on the mirror's artifacts a node holds and the disk it has for more,
as placement reads them. No Temporal."""

from workers.commands.node import artifacts_line
from workflows.contracts import NodeInventory


def test_node_show_says_what_the_node_holds_and_its_room_for_more() -> None:
    held = ["sha256:0123456789abcdef", "sha256:fedcba9876543210"]
    inventory = NodeInventory(name="n1", artifacts=held, artifact_disk_free_mb=45_000)
    assert artifacts_line(inventory) == "2 held, 45 GB free for more"
    small = inventory.model_copy(update={"artifacts": [], "artifact_disk_free_mb": 4_300})
    assert artifacts_line(small) == "0 held, 4.3 GB free for more"
    # An agent from before free space was reported.
    old = NodeInventory(name="n2")
    assert artifacts_line(old) == "0 held, free disk not reported"
