"""How loud a command is. A command prints what it is for; only a process (the control worker,
an agent, a gateway, the mirror's server) logs what it does as it goes. Any other command logs
warnings and failures only, or everything with --verbose (each HTTP call it makes included)."""

import argparse


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log what the command does (each call it makes), not only warnings and failures",
    )
