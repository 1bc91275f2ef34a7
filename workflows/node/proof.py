"""A node's registration, signed so that no copy of it can be replayed. Pure; used by the agent
(workers/agent.py signs) and by the node workflow's `register` validator (workflows/node/rules.py
checks), inside the sandbox.

A registration is stored in the node workflow's history, where anyone with the Temporal UI reads
it, so it cannot carry anything that proves the node on its own: the identity it once sent,
sha256 of the node secret, was such a constant, and a copy registered any machine as the node.
Now the identity is an Ed25519 public key derived from the node secret, which the workflow pins
(it never holds a secret: the control worker has no master secret to derive one from), and each
registration carries a signature, made with the private key, over the node's name, the agent's
boot id and machine id and the moment it was signed. The workflow takes a signature only if it
is newer than the last one it accepted and within CLOCK_SKEW of its own clock: a copy from
history is older than the registration it copies.
"""

from __future__ import annotations

import hashlib
import hmac

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from workflows.contracts import NodeRegistration

KEY_PREFIX = "ed25519:"
# How far a registration's signing time may be from the control plane's clock. Wide enough for
# clocks that NTP keeps, narrow enough that a copy is stale before a workflow made anew (after
# `llmgw node rm`, a Terminate) has forgotten the last signature it took.
CLOCK_SKEW_MS = 5 * 60 * 1000


def is_key_identity(identity: str) -> bool:
    """A pinned key (this scheme) rather than the older sha256 identity."""
    return identity.startswith(KEY_PREFIX)


def _private_key(node_secret: bytes) -> Ed25519PrivateKey:
    seed = hmac.new(node_secret, b"node-identity-key:v1", hashlib.sha256).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


def identity_key(node_secret: bytes) -> str:
    """The identity a node workflow pins: the public key, safe in history, the same for every
    holder of the node's join token."""
    public = _private_key(node_secret).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return KEY_PREFIX + public.hex()


def signed_text(node: str, boot_id: str, machine_id: str, signed_at_ms: int) -> bytes:
    """What is signed: bound to this node, this boot of this machine and this moment."""
    return "\n".join(["llmgw-register:v1", node, boot_id, machine_id, str(signed_at_ms)]).encode()


def sign(node_secret: bytes, text: bytes) -> str:
    return _private_key(node_secret).sign(text).hex()


def signature_problem(identity: str, text: bytes, proof: str) -> str | None:
    """Why `proof` is not `identity`'s signature of `text`; None when it is."""
    try:
        public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(identity[len(KEY_PREFIX) :]))
        public.verify(bytes.fromhex(proof), text)
    except (ValueError, InvalidSignature):
        return "its proof is not signed by the key it names"
    return None


def signed_registration(reg: NodeRegistration, node_secret: bytes, now_ms: int) -> NodeRegistration:
    """`reg` with the node's key identity and a signature made now (the agent's clock)."""
    node = reg.inventory.name
    text = signed_text(node, reg.boot_id, reg.inventory.machine_id, now_ms)
    return reg.model_copy(
        update={
            "identity": identity_key(node_secret),
            "signed_at_ms": now_ms,
            "proof": sign(node_secret, text),
        }
    )
