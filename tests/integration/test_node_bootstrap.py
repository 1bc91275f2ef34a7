"""`llmgw node bootstrap` on a fresh host against a real control plane: host `ctl` (a network
namespace, tests/integration/netns_hosts.py) runs Temporal, the control worker and the store as
tests/integration/multi_host.py sets them up; host `b1` has nothing of llmgw's but the package.

Bad tokens (malformed, for an unreachable control plane, one the node was not joined with) are
refused with nothing written, and --dry-run writes nothing either. Then bootstrap writes the
unit and its environment file; b1 has no systemd, so bootstrap says so, and the test runs the
unit's ExecStart with its EnvironmentFile as systemd would (tests/systemd_exec.py). The node
joins, is ready in the fleet and in `llmgw nodes`, with the token in no command line; a second
bootstrap changes nothing.

Needs root; skipped, saying why, where namespaces cannot be made, unless LLMGW_REQUIRE_NETNS=1.
"""

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.fleet import token_from
from tests.integration.multi_host import Cluster, NodeHost, control_plane_in_namespaces
from tests.system import STANDIN_ENGINE
from tests.systemd_exec import service
from workers.join import JoinToken
from workflows.contracts import NodeState

pytestmark = pytest.mark.integration

NODE = "b1"


@pytest.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    async with control_plane_in_namespaces(tmp_path_factory.mktemp("bootstrap")) as cluster:
        yield cluster


def fresh_env() -> dict[str, str]:
    """A root shell on a machine that never ran llmgw: no LLMGW_* setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}


async def test_a_fresh_host_bootstraps_joins_and_a_second_run_changes_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    host = cluster.network.add_host(NODE, 21)
    added = cluster.cli("node", "add", NODE, "--join-address", cluster.temporal)
    token = token_from(added.stdout)
    root = tmp_path / "b1-root"
    layout = {"--config-dir": root / "etc", "--unit-dir": root / "units",
              "--state-dir": root / "state", "--cache-dir": root / "cache"}  # fmt: skip

    def bootstrap(join: str, *more: str) -> tuple[int, str]:
        cmd = [*cluster.llmgw_cmd("node", "bootstrap", "--join", join, "--user", "root", *more),
               *[str(w) for pair in layout.items() for w in pair],
               "--engine-path", f"llamacpp={STANDIN_ENGINE}", "--label", "via=bootstrap",
               "--agent-arg=--heartbeat-every=1",
               # The stand-in engine is a script for this environment's Python (aiohttp).
               "--env", f"STANDIN_PYTHON={sys.executable}"]  # fmt: skip
        done = cluster.network.run(NODE, cmd, env=fresh_env(), cwd=tmp_path, timeout=60)
        return done.returncode, done.stdout + done.stderr

    # Refused, each before anything is written (run side by side: each is a CLI start).
    secret = JoinToken.decode(token).secret
    refusals = {
        "malformed": "llmgw-join-???",
        "cannot reach": JoinToken(NODE, f"{cluster.ctl.address}:7299", secret).encode(),
        "another token": JoinToken(NODE, cluster.temporal, b"\x01" * 32).encode(),
    }
    runs = [asyncio.to_thread(bootstrap, join) for join in refusals.values()]
    # And --dry-run, which checks as much and says what it would do.
    runs.append(asyncio.to_thread(bootstrap, token, "--dry-run"))
    *answers, (code, out) = await asyncio.gather(*runs)
    for said, (refused, why) in zip(refusals, answers, strict=True):
        assert refused == 2, why
        assert said in why, why
        assert "Nothing was written" in why, why
    assert code == 0, out
    assert f"would write {root / 'etc' / 'agent.env'} (0600 root:root; holds the join" in out
    assert "--dry-run: nothing was changed" in out, out
    assert not root.exists()

    code, out = bootstrap(token)
    assert code == 0, out
    assert "systemd is not running here" in out, out
    assert f"It joins as node {NODE}" in out, out
    env_file, unit_file = root / "etc" / "agent.env", root / "units" / "llmgw-agent.service"
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert (root / "state").stat().st_mode & 0o777 == 0o700
    unit = unit_file.read_text()
    assert token not in unit
    assert token not in out

    ran = service(unit)
    assert ran.user == "root"
    log = cluster.root / "logs" / "b1-agent.log"
    agent = cluster.network.popen(NODE, ran.argv, env=ran.env, log=log, cwd=Path("/"))
    # A node host of the cluster's: stopped first, while Temporal still answers its goodbye.
    cluster.nodes[NODE] = NodeHost(host, root / "state", agent)

    async def joined() -> bool:
        record = (await cluster.ledger()).nodes.get(NODE)
        return (
            record is not None
            and record.state == NodeState.READY
            and record.engines.get("llamacpp") is not None
            and record.engines["llamacpp"].state.value == "installed"
        )

    try:
        await cluster.until(joined, 120, "the bootstrapped node ready")
    except AssertionError as err:
        raise AssertionError(f"{err}\nb1's agent log:\n{log.read_text()[-4000:]}") from None
    record = (await cluster.ledger()).nodes[NODE]
    assert record.inventory.address == host.address  # found from the route to ctl
    assert record.labels["via"] == "bootstrap"
    line = next(x for x in cluster.cli("nodes").stdout.splitlines() if x.startswith(NODE + " "))
    assert " ready " in line, line
    assert token.encode() not in Path(f"/proc/{agent.pid}/cmdline").read_bytes()

    written = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (env_file, unit_file)}
    code, out = bootstrap(token)
    assert code == 0, out
    assert "nothing to change" in out, out
    assert "did:" not in out, out
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in written} == written
