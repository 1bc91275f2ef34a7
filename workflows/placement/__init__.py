"""Where a replica goes: filter the nodes, then score the rest. Pure: data in, data out.

Every node that is filtered out gets a reason in its own words, so an operator can be told why
a model did not land ("llamacpp installing: building llama-server 45%", "2 of 8 h100-80g free,
4 wanted"). A model's profiles are tried in order and the first that fits somewhere wins.

- usage.py: what allocations already hold on each node (every shard counts)
- index.py: that usage and what placement reads of each node, kept between placements
- checks.py: whether one node can take one shard of a profile, and which GPUs it gets
- disk.py: whether a node that must fetch a model's weights has the disk for them
- fabric.py: which nodes a multi-node replica can span (NVLink domain, InfiniBand, RoCE)
- place.py: place(), first_fit() and explain()
"""

from workflows.placement.checks import profile_label, why_not
from workflows.placement.index import PlacementIndex
from workflows.placement.place import CLUSTER, explain, first_fit, place
from workflows.placement.usage import NodeUsage, free_port, node_usage

__all__ = [
    "CLUSTER",
    "NodeUsage",
    "PlacementIndex",
    "explain",
    "first_fit",
    "free_port",
    "node_usage",
    "place",
    "profile_label",
    "why_not",
]
