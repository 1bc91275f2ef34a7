"""Join tokens: how a machine becomes a node of a cluster.

`llmgw node add NAME` (run where the store is) derives the node's secret from the master
secret and prints a token holding the node's name, the Temporal address and that secret.
`llmgw agent --join TOKEN` on the new machine keeps the secret in its state directory (0600)
and registers with the secret's identity, which the node workflow pins: another machine cannot
register under this name without this token. The token is a credential: it opens this node's
engines, no other node's.
"""

import base64
import binascii
import json
from dataclasses import dataclass

from workers.paths import Locations
from workers.secret_files import write_secret_file

TOKEN_PREFIX = "llmgw-join-"  # noqa: S105 - a prefix, not a secret


@dataclass(frozen=True)
class JoinToken:
    node: str
    temporal: str
    secret: bytes

    def encode(self) -> str:
        body = json.dumps(
            {"node": self.node, "temporal": self.temporal, "secret": self.secret.hex()}
        )
        return TOKEN_PREFIX + base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> "JoinToken":
        token = token.strip()
        if not token.startswith(TOKEN_PREFIX):
            raise ValueError(f"a join token starts with {TOKEN_PREFIX!r}")
        body = token[len(TOKEN_PREFIX) :]
        try:
            data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            return cls(
                node=str(data["node"]),
                temporal=str(data["temporal"]),
                secret=bytes.fromhex(data["secret"]),
            )
        except (binascii.Error, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"not a valid join token ({err})") from None


def accept_join_token(where: Locations, token: JoinToken) -> None:
    """Keep the node's secret where the agent reads it."""
    write_secret_file(where.node_secret_file(token.node), token.secret.hex())
