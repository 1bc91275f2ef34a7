"""The refusals `llmgw node bootstrap` makes before it writes anything: flags that cannot work,
and a join token the control plane would not take. Pure."""

import re

from workers.commands.node_bootstrap.unit import PLAIN
from workflows.contracts import NodeState, NodeView
from workflows.node.proof import is_key_identity

# Set by bootstrap's own flags (or the token); `--env` may not set them a second way.
OWN_VARIABLES = frozenset(
    {
        "AGENT_NODE",
        "AGENT_ADDRESS",
        "AGENT_METRICS_PORT",
        "LLMGW_STATE_DIR",
        "LLMGW_CACHE_DIR",
        "LLMGW_JOIN_TOKEN",
        "LLMGW_TEMPORAL_NAMESPACE",
        "LLMGW_PAYLOAD_KEY_FILE",
    }
)
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def token_refusal(
    node: str, temporal: str, identity: str, view: NodeView | None, machine_id: str
) -> str | None:
    """Why the control plane would not let this machine register with this token, or None.

    A join token carries no expiry date; it stops joining when its node is removed or was joined
    with another token (the node added again after a removal, or a store with another master
    secret). The node workflow's register validator (workflows/node/rules.py) refuses these
    too, but only once the agent runs, in its log; here they stop bootstrap before it writes."""
    fresh = f"`llmgw node add {node}` where the store is prints a current token"
    if view is None:
        return (
            f"the control plane at {temporal} has no node {node!r}: it was never added there, "
            f"or was removed; {fresh}"
        )
    if view.record.state == NodeState.REMOVED:
        return f"node {node!r} was removed (`llmgw node rm`): this token joins nothing; {fresh}"
    if is_key_identity(view.identity) and view.identity != identity:
        return (
            f"node {node!r} was joined with another token: this one is stale (the node was "
            f"added again, or the store's master secret changed); {fresh}"
        )
    theirs = view.record.inventory.machine_id
    if view.record.state == NodeState.READY and theirs and machine_id and theirs != machine_id:
        return (
            f"node {node!r} is live on another machine ({view.record.inventory.hostname}); two "
            f"agents cannot share a node name: stop that one, or `llmgw node rm {node}` first"
        )
    return None


def service_user(given: str | None, install_os_packages: bool) -> str:
    if install_os_packages and given not in (None, "root"):
        raise ValueError(
            "--install-os-packages lets the agent run apt-get or dnf, which needs root: "
            "leave --user out (the agent then runs as root) or pass --user root"
        )
    return given or ("root" if install_os_packages else "llmgw")


def plain(word: str, what: str) -> str:
    if not PLAIN.fullmatch(word):
        raise ValueError(
            f"{what} {word!r}: only letters, digits and . _ / : = , @ + - can be written into "
            "the unit"
        )
    return word


def agent_flags(
    labels: list[str],
    engine_paths: dict[str, str],
    mirror: str,
    install_os_packages: bool,
    temporal: str | None,
    extra: list[str],
) -> tuple[str, ...]:
    """The agent's flags beyond node, address and metrics, each word fit for ExecStart."""
    words: list[str] = []
    for label in labels:
        key, sep, _ = label.partition("=")
        if not sep or not key:
            raise ValueError(f"--label wants KEY=VALUE, got {label!r}")
        words += ["--label", plain(label, "--label")]
    for engine, path in sorted(engine_paths.items()):
        words += ["--engine-path", plain(f"{engine}={path}", "--engine-path")]
    if mirror:
        words += ["--mirror", plain(mirror, "--mirror")]
    if temporal:
        # The agent dials the token's address unless told another (workers/cli.py join).
        words += ["--temporal", plain(temporal, "--temporal")]
    if install_os_packages:
        words.append("--install-os-packages")
    for word in extra:
        if word.split("=", 1)[0] in ("--join", "--node", "--address", "--state-dir"):
            raise ValueError(f"--agent-arg {word!r}: bootstrap sets that itself")
        words.append(plain(word, "--agent-arg"))
    return tuple(words)


def extra_env(values: list[str]) -> tuple[tuple[str, str], ...]:
    found: dict[str, str] = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not VARIABLE.fullmatch(name):
            raise ValueError(f"--env wants NAME=VALUE, got {value!r}")
        if name in OWN_VARIABLES or name.startswith("LLMGW_TEMPORAL_"):
            raise ValueError(f"--env {name}: bootstrap sets it from its own flags")
        found[name] = text
    return tuple(sorted(found.items()))
