"""The payload codec and its key file: sealed payloads open with the same key only, payloads from
before the key still read, and a bad key file is refused naming the file, never a key."""

import base64
import os
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload

from workflows.client import data_converter
from workflows.contracts import ModelSpec, Profile
from workflows.payload_codec import (
    ENCRYPTED,
    EncryptionCodec,
    PayloadDecryptError,
    PayloadKeyError,
    PayloadKeys,
    key_id,
    read_payload_keys,
)

MARKER = "secret:not-in-history"


def write_keys(path: Path, *keys: bytes, mode: int = 0o600) -> Path:
    path.write_text("".join(base64.b64encode(k).decode() + "\n" for k in keys))
    path.chmod(mode)
    return path


def spec() -> ModelSpec:
    return ModelSpec(name="m", weights="/w", profiles=[Profile(env={"HF_TOKEN": MARKER})])


async def test_a_payload_is_sealed_and_opens_with_the_same_key() -> None:
    keys = PayloadKeys((os.urandom(32),))
    converter = data_converter(keys)
    [sealed] = await converter.encode([spec()])
    assert sealed.metadata["encoding"] == ENCRYPTED
    assert sealed.metadata["encryption-key-id"] == key_id(keys.keys[0]).encode()
    assert MARKER.encode() not in sealed.SerializeToString()
    [back] = await data_converter(keys).decode([sealed], [ModelSpec])
    assert back == spec()


async def test_a_payload_from_before_the_key_still_reads() -> None:
    [plain] = await data_converter(None).encode([spec()])
    assert plain.metadata["encoding"] == b"json/plain"
    [back] = await data_converter(PayloadKeys((os.urandom(32),))).decode([plain], [ModelSpec])
    assert back == spec()


async def test_another_key_or_no_key_fails_naming_the_key_it_needs() -> None:
    sealer = PayloadKeys((os.urandom(32),))
    [sealed] = await data_converter(sealer).encode([spec()])
    needed = key_id(sealer.keys[0])
    with pytest.raises(PayloadDecryptError, match=f"payload key {needed}, which this process"):
        await data_converter(PayloadKeys((os.urandom(32),))).decode([sealed], [ModelSpec])
    with pytest.raises(PayloadDecryptError, match="none: no payload key is configured"):
        await data_converter(None).decode([sealed], [ModelSpec])


async def test_an_altered_payload_does_not_open() -> None:
    keys = PayloadKeys((os.urandom(32),))
    [sealed] = await EncryptionCodec(keys).encode([Payload(data=b"{}")])
    altered = Payload()
    altered.CopyFrom(sealed)
    altered.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    with pytest.raises(PayloadDecryptError, match="does not open with that key"):
        await EncryptionCodec(keys).decode([altered])


async def test_a_rotated_key_file_seals_with_its_first_key_and_opens_with_all(
    tmp_path: Path,
) -> None:
    old, new = os.urandom(32), os.urandom(32)
    [by_old] = await EncryptionCodec(PayloadKeys((old,))).encode([Payload(data=b"1")])
    rotated = read_payload_keys(write_keys(tmp_path / "k", new, old))
    [by_new] = await EncryptionCodec(rotated).encode([Payload(data=b"2")])
    assert by_new.metadata["encryption-key-id"] == key_id(new).encode()
    opened = await EncryptionCodec(rotated).decode([by_old, by_new])
    assert [p.data for p in opened] == [b"1", b"2"]


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = write_keys(tmp_path / "k", os.urandom(32), mode=0o644)
    with pytest.raises(PayloadKeyError, match=r"readable by other users \(mode 644\)"):
        read_payload_keys(path)
    path.chmod(0o640)  # the service's group may read it
    assert len(read_payload_keys(path).keys) == 1


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "holds no key"),
        ("# only a comment\n", "holds no key"),
        ("not base64!\n", "line 1 is not a key"),
        (base64.b64encode(b"short").decode(), "line 1 is not a key"),
    ],
)
def test_a_malformed_key_file_is_refused_without_quoting_it(
    tmp_path: Path, text: str, why: str
) -> None:
    path = tmp_path / "k"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(PayloadKeyError, match=why) as caught:
        read_payload_keys(path)
    assert str(path) in str(caught.value)
    if text.strip():
        assert text.strip() not in str(caught.value)


def test_a_missing_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PayloadKeyError, match="does not exist"):
        read_payload_keys(tmp_path / "none")
