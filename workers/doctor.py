"""`llmgw doctor`: check what this node's GPUs, NVLink, fabric and engines need, and say how to
fix what is wrong, most serious first. Exit status 1 when any check fails."""

from __future__ import annotations

import argparse
import sys

from activities.agent.doctor.gather import gather_facts
from workers.paths import Locations, default_node_name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", default=default_node_name(), help="the agent's node name")
    parser.add_argument(
        "--address", default="127.0.0.1", help="the node's address, as given to the agent"
    )
    parser.add_argument("--state-dir", help="default $LLMGW_STATE_DIR or ~/.local/state/llmgw")
    parser.add_argument(
        "--engine-path",
        action="append",
        default=[],
        metavar="ENGINE=PATH",
        help="an operator-provided engine binary the agent is given, to verify as well",
    )
    parser.add_argument(
        "--json", action="store_true", help="print every fact concluded from, and the findings"
    )


def _engine_paths(values: list[str]) -> dict[str, str]:
    paths: dict[str, str] = {}
    for value in values:
        engine, sep, path = value.partition("=")
        if not sep or not engine or not path:
            raise SystemExit(f"--engine-path wants ENGINE=PATH, got {value!r}")
        paths[engine] = path
    return paths


def run(args: argparse.Namespace) -> int:
    from activities.agent.doctor.checks import diagnose, failed
    from activities.agent.doctor.report import render_json, render_text

    where = Locations.resolve(args.state_dir)
    facts = gather_facts(where.state_dir, args.node, args.address, _engine_paths(args.engine_path))
    findings = diagnose(facts)
    out = render_json(facts, findings) if args.json else render_text(facts, findings)
    sys.stdout.write(out)
    sys.stdout.flush()
    return 1 if failed(findings) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmgw doctor", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
