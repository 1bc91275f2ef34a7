"""Every Temporal payload encrypted with AES-256-GCM, when a payload key file is configured.

Temporal stores every workflow's and activity's inputs, results, heartbeat details, signals,
updates and queries in its database and shows them in its web UI. With a key, each payload is
sealed in the process that makes it and opened in the one that reads it (Temporal's encryption
sample's pattern): the server and its database only ever hold `binary/encrypted` payloads and the
id of the key that sealed them. Failure messages and search attributes stay readable (Temporal
does not encode them), so an operator still sees why a run failed and can list workflows.

The key file holds one key per line, base64 of 32 random bytes (`llmgw up --encrypt-payloads`
makes one; `head -c 32 /dev/urandom | base64` is one). The first line seals; every line opens,
so a key is rotated by putting a new one first and keeping the old ones below while histories
sealed with them live. A payload that is not encrypted (written before the key was configured)
is read as it is.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

ENCRYPTED = b"binary/encrypted"
KEY_ID = "encryption-key-id"
PAYLOAD_KEY_SETTING = "--payload-key-file ($LLMGW_PAYLOAD_KEY_FILE)"
_NONCE_BYTES = 12
# Bound to every sealed payload: a ciphertext made for anything else does not open as one.
_ASSOCIATED = b"llmgw-payload:v1"


class PayloadKeyError(ValueError):
    """A payload key file that cannot be used. Names the file, never a key."""


class PayloadDecryptError(ValueError):
    """A payload this process cannot open: the message says which key it needs."""


def key_id(key: bytes) -> str:
    """The key's public name in each payload's metadata: a hash, so it tells nothing of the
    key, and the same in every process holding the key."""
    return hashlib.sha256(b"llmgw-payload-key-id:" + key).hexdigest()[:16]


@dataclass(frozen=True)
class PayloadKeys:
    # The first seals; all open. Each 32 bytes.
    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys or any(len(k) != 32 for k in self.keys):
            raise PayloadKeyError("a payload key is 32 bytes")

    def __repr__(self) -> str:
        return f"PayloadKeys(ids={[key_id(k) for k in self.keys]})"


def new_key_line() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def read_payload_keys(path: Path) -> PayloadKeys:
    """The keys in `path`; raises PayloadKeyError for a missing, unsafe or malformed file."""
    try:
        with path.open("rb") as file:
            data, mode = file.read(), os.fstat(file.fileno()).st_mode
    except FileNotFoundError:
        raise PayloadKeyError(f"{PAYLOAD_KEY_SETTING}: {path} does not exist") from None
    except IsADirectoryError:
        raise PayloadKeyError(f"{PAYLOAD_KEY_SETTING}: {path} is a directory") from None
    except OSError as err:
        raise PayloadKeyError(
            f"{PAYLOAD_KEY_SETTING}: cannot read {path}: {err.strerror}"
        ) from None
    # Group read is allowed, as for Temporal API key files (workflows/temporal_security.py): an
    # orchestrator often shares it with the service's group.
    if mode & stat.S_IRWXO:
        raise PayloadKeyError(
            f"{PAYLOAD_KEY_SETTING}: {path} is readable by other users "
            f"(mode {stat.S_IMODE(mode):o}); chmod o-rwx {path}"
        )
    keys = []
    for number, line in enumerate(data.splitlines(), 1):
        text = line.strip()
        if not text or text.startswith(b"#"):
            continue
        try:
            key = base64.b64decode(text, validate=True)
        except binascii.Error:
            key = b""
        if len(key) != 32:
            raise PayloadKeyError(
                f"{PAYLOAD_KEY_SETTING}: {path} line {number} is not a key (base64 of 32 bytes)"
            )
        keys.append(key)
    if not keys:
        raise PayloadKeyError(f"{PAYLOAD_KEY_SETTING}: {path} holds no key")
    return PayloadKeys(tuple(keys))


class EncryptionCodec(PayloadCodec):
    """Seals with the first key, opens with any; `keys` None: seals nothing, and says clearly
    that an encrypted payload needs a key rather than failing on an unknown encoding."""

    def __init__(self, keys: PayloadKeys | None) -> None:
        self._sealer = (key_id(keys.keys[0]), AESGCM(keys.keys[0])) if keys else None
        self._openers = {key_id(k): AESGCM(k) for k in keys.keys} if keys else {}

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if self._sealer is None:
            return list(payloads)
        kid, aes = self._sealer
        sealed = []
        for payload in payloads:
            nonce = os.urandom(_NONCE_BYTES)
            data = nonce + aes.encrypt(nonce, payload.SerializeToString(), _ASSOCIATED)
            sealed.append(
                Payload(metadata={"encoding": ENCRYPTED, KEY_ID: kid.encode()}, data=data)
            )
        return sealed

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._open(p) for p in payloads]

    def _open(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCRYPTED:
            return payload  # written before a key was configured
        kid = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        aes = self._openers.get(kid)
        if aes is None:
            held = ", ".join(self._openers) or "none: no payload key is configured"
            raise PayloadDecryptError(
                f"a Temporal payload is encrypted with payload key {kid}, which this process "
                f"does not hold (it holds {held}); set {PAYLOAD_KEY_SETTING} to a file with "
                "that key"
            )
        try:
            plain = aes.decrypt(
                payload.data[:_NONCE_BYTES], payload.data[_NONCE_BYTES:], _ASSOCIATED
            )
        except InvalidTag:
            raise PayloadDecryptError(
                f"a Temporal payload sealed with payload key {kid} does not open with that key: "
                "it was altered or cut"
            ) from None
        return Payload.FromString(plain)
