"""Engine keys: every engine refuses requests without its key, which only the gateway holds.

The key is a function of a shared secret rather than a row per replica, so a gateway can send
the right key to replicas it never saw start (adopted after a restart, or started while it was
down). Two levels keep a node from holding more than it needs: the master secret (in the
gateway's store) derives a per-node secret, which is all an agent is given; the node secret
derives each of its replicas' keys. A key taken from one engine opens that replica only.

Keys are derived where they are used and never travel in a workflow payload.
"""

import hashlib
import hmac
import secrets

ENGINE_KEY_PREFIX = "llmgw-engine-"


def new_master_secret() -> bytes:
    return secrets.token_bytes(32)


def node_secret(master: bytes, node: str) -> bytes:
    return hmac.new(master, b"node:" + node.encode(), hashlib.sha256).digest()


def engine_key(node_secret_value: bytes, replica_id: str) -> str:
    mac = hmac.new(node_secret_value, b"replica:" + replica_id.encode(), hashlib.sha256)
    return ENGINE_KEY_PREFIX + mac.hexdigest()


def engine_key_from_master(master: bytes, node: str, replica_id: str) -> str:
    return engine_key(node_secret(master, node), replica_id)


def kv_feed_token(node_secret_value: bytes) -> str:
    """What a gateway shows a node agent to read its KV feed (kv/feed.py). The gateway
    derives it from the master secret and the node's name, the agent from its node secret."""
    mac = hmac.new(node_secret_value, b"kv-feed:v1", hashlib.sha256)
    return mac.hexdigest()


def cache_salt_from_master(master: bytes, key_id: str) -> str:
    """The prefix-cache salt of one API key (gateway/cache_salt.py): never stored, the same on
    every gateway and across restarts, and not computable without the master secret, so no
    tenant can name another's salt and share its cached blocks."""
    return hmac.new(master, b"cache-salt:" + key_id.encode(), hashlib.sha256).hexdigest()


def prefix_hash_key(master: bytes) -> bytes:
    """The key of the gateways' prefix hashes (gateway/routing/prefix_index.py): the same on
    every gateway process, so what one sent where can be told to the others."""
    return hmac.new(master, b"prefix-hash:v1", hashlib.sha256).digest()[:32]


def peer_bus_key(master: bytes) -> bytes:
    """What the gateways sign their peer bus frames with (gateway/peers/wire.py)."""
    return hmac.new(master, b"peer-bus:v1", hashlib.sha256).digest()


def mirror_token(node_secret_value: bytes) -> str:
    """What a node agent shows the control plane's mirror to fetch artifacts. The mirror
    derives it from the master secret and the node's name, the agent from its node secret."""
    mac = hmac.new(node_secret_value, b"mirror:v1", hashlib.sha256)
    return mac.hexdigest()
