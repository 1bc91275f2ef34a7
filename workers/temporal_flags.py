"""The flags and environment variables that say how to reach Temporal: namespace, TLS, mutual
TLS, an API key, and the payload key (workflows/payload_codec.py). A flag wins over its
variable; a variable set once per machine (the systemd env file, a container's environment)
points every command at the same cluster the same way.

The API key and the payload key are named by a file, never given as a value: a value in a flag
or a variable shows in `ps`, in /proc/PID/environ and in `systemctl show`.
"""

import argparse
from collections.abc import Mapping
from pathlib import Path

from workflows.client import DEFAULT_NAMESPACE
from workflows.temporal_security import TemporalSecurity, TemporalSecurityError

# flag destination -> environment variable
PATH_SETTINGS = {
    "temporal_tls_ca": "LLMGW_TEMPORAL_TLS_CA",
    "temporal_tls_cert": "LLMGW_TEMPORAL_TLS_CERT",
    "temporal_tls_key": "LLMGW_TEMPORAL_TLS_KEY",
    "temporal_api_key_file": "LLMGW_TEMPORAL_API_KEY_FILE",
}
TLS_VARIABLE = "LLMGW_TEMPORAL_TLS"
SERVER_NAME_VARIABLE = "LLMGW_TEMPORAL_TLS_SERVER_NAME"
NAMESPACE_VARIABLE = "LLMGW_TEMPORAL_NAMESPACE"
# Refused rather than ignored: an operator who guesses this name would otherwise connect
# without a key and wonder why the cluster says "unauthenticated".
REFUSED_KEY_VARIABLE = "LLMGW_TEMPORAL_API_KEY"
# Every variable this module reads for the connection: `llmgw up` keeps them from its children,
# which talk to the plaintext dev server it runs (workers/up.py).
SECURITY_VARIABLES = (*PATH_SETTINGS.values(), TLS_VARIABLE, SERVER_NAME_VARIABLE)
# Not a connection setting: `up` hands its children its own payload key (workers/up.py).
PAYLOAD_KEY_VARIABLE = "LLMGW_PAYLOAD_KEY_FILE"

TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


def add_temporal_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Temporal connection")
    group.add_argument("--temporal", help="Temporal address, default $LLMGW_TEMPORAL_ADDRESS")
    group.add_argument(
        "--temporal-namespace",
        metavar="NAMESPACE",
        help=f"default ${NAMESPACE_VARIABLE} or {DEFAULT_NAMESPACE}",
    )
    group.add_argument(
        "--temporal-tls",
        action="store_true",
        default=None,
        help=f"TLS with the system's trusted roots (${TLS_VARIABLE}=1); any option below "
        "turns TLS on too",
    )
    group.add_argument(
        "--temporal-tls-ca", metavar="PEM", help="CA that signed the server's certificate"
    )
    group.add_argument(
        "--temporal-tls-cert", metavar="PEM", help="client certificate, for mutual TLS"
    )
    group.add_argument(
        "--temporal-tls-key",
        metavar="PEM",
        help="the client certificate's private key (not readable by other users)",
    )
    group.add_argument(
        "--temporal-tls-server-name",
        metavar="NAME",
        help="the name the server's certificate is checked against, when not the address's host",
    )
    group.add_argument(
        "--temporal-api-key-file",
        metavar="FILE",
        help="a file holding the API key (Temporal Cloud); implies TLS",
    )
    group.add_argument(
        "--payload-key-file",
        metavar="FILE",
        help=f"encrypt every Temporal payload with the keys in FILE (${PAYLOAD_KEY_VARIABLE}); "
        "every process of the cluster needs the same file",
    )


def env_flag(env: Mapping[str, str], name: str) -> bool | None:
    if name not in env:
        return None
    value = env[name].strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise TemporalSecurityError(f"{name}={env[name]!r}: use 1 or 0")


def namespace_from(args: argparse.Namespace | None, env: Mapping[str, str]) -> str:
    given = getattr(args, "temporal_namespace", None)
    namespace = given or env.get(NAMESPACE_VARIABLE) or DEFAULT_NAMESPACE
    if not namespace.strip():
        raise TemporalSecurityError("the Temporal namespace is empty")
    return namespace


def security_from(args: argparse.Namespace | None, env: Mapping[str, str]) -> TemporalSecurity:
    """Flags over variables; raises TemporalSecurityError for settings that cannot work."""
    if env.get(REFUSED_KEY_VARIABLE):
        raise TemporalSecurityError(
            f"{REFUSED_KEY_VARIABLE} is not read: put the key in a file only llmgw's user can "
            "read and name it in LLMGW_TEMPORAL_API_KEY_FILE (or --temporal-api-key-file)"
        )
    paths: dict[str, Path | None] = {}
    for dest, variable in PATH_SETTINGS.items():
        value = getattr(args, dest, None) or env.get(variable) or None
        paths[dest] = Path(value).expanduser().absolute() if value else None
    server_name = getattr(args, "temporal_tls_server_name", None) or env.get(SERVER_NAME_VARIABLE)
    payload_key = getattr(args, "payload_key_file", None) or env.get(PAYLOAD_KEY_VARIABLE)
    tls_flag = getattr(args, "temporal_tls", None)
    tls = tls_flag if tls_flag is not None else env_flag(env, TLS_VARIABLE)
    security = TemporalSecurity(
        tls=bool(tls),
        ca_file=paths["temporal_tls_ca"],
        cert_file=paths["temporal_tls_cert"],
        key_file=paths["temporal_tls_key"],
        server_name=server_name or None,
        api_key_file=paths["temporal_api_key_file"],
        payload_key_file=Path(payload_key).expanduser().absolute() if payload_key else None,
    )
    if tls is False and security.uses_tls:
        raise TemporalSecurityError(
            f"{TLS_VARIABLE}=0, but a TLS file, server name or API key file is set: an API key "
            "is sent only over TLS, and the files mean TLS"
        )
    return security
