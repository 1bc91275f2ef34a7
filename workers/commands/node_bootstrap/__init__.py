"""`llmgw node bootstrap`: a fresh Linux machine made a node in one command (docs/nodes.md,
"Bootstrap a node"). unit.py renders the systemd unit and environment file, plan.py decides
what to do, observe.py and control_plane.py read the machine and the cluster, execute.py acts,
command.py is the command."""

from workers.commands.node_bootstrap.command import add_bootstrap_parser, run_bootstrap

__all__ = ["add_bootstrap_parser", "run_bootstrap"]
