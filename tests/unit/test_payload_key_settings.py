"""How every process finds its payload key (workflows/payload_codec.py): the flag or variable of
every command that connects, and `llmgw up`'s own key in its state dir, handed to its children."""

import argparse
import base64
import os
from dataclasses import replace
from pathlib import Path

import pytest

from workers.cli import build_parser, locations, main
from workers.payload_key import up_payload_key
from workers.up import child_env
from workflows.payload_codec import PayloadKeyError, read_payload_keys


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "payload.key"
    path.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("command", ["control", "agent", "gateway", "status"])
def test_every_connecting_command_takes_the_flag_and_the_variable(
    command: str, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flagged = locations(parse([command, "--payload-key-file", str(key_file)]))
    assert flagged.security.payload_key_file == key_file
    assert "encrypted payloads" in flagged.security.describe()
    monkeypatch.setenv("LLMGW_PAYLOAD_KEY_FILE", str(key_file))
    assert locations(parse([command])).security.payload_key_file == key_file
    monkeypatch.delenv("LLMGW_PAYLOAD_KEY_FILE")
    assert locations(parse([command])).security.payload_key_file is None


def test_a_bad_key_file_stops_the_command_at_once_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_PAYLOAD_KEY_FILE", str(tmp_path / "absent.key"))
    with pytest.raises(SystemExit, match="Temporal connection settings: --payload-key-file"):
        main(["control", "--state-dir", str(tmp_path)])


def test_up_makes_a_key_only_when_asked_then_always_uses_it(tmp_path: Path) -> None:
    assert up_payload_key(tmp_path, {}, make=False) is None
    assert not (tmp_path / "payload.key").exists()
    made = up_payload_key(tmp_path, {}, make=True)
    assert made == tmp_path.absolute() / "payload.key"
    assert made.stat().st_mode & 0o777 == 0o600
    keys = read_payload_keys(made)
    # The next `up` without the flag keeps sealing with it: its history needs it to read back.
    assert up_payload_key(tmp_path, {}, make=False) == made
    assert up_payload_key(tmp_path, {}, make=True) == made
    assert read_payload_keys(made) == keys


def test_up_takes_a_key_file_named_by_the_variable(tmp_path: Path, key_file: Path) -> None:
    state = tmp_path / "state"
    env = {"LLMGW_PAYLOAD_KEY_FILE": str(key_file)}
    assert up_payload_key(state, env, make=True) == key_file
    assert not (state / "payload.key").exists()
    key_file.chmod(0o644)
    with pytest.raises(PayloadKeyError, match="readable by other users"):
        up_payload_key(state, env, make=False)


def test_up_hands_its_children_its_own_key(
    key_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_PAYLOAD_KEY_FILE", "/elsewhere/cluster.key")
    where = locations(parse(["up", "--state-dir", str(tmp_path)]))
    assert "LLMGW_PAYLOAD_KEY_FILE" not in child_env(where)  # none chosen: none handed on
    keyed = replace(where, security=replace(where.security, payload_key_file=key_file))
    assert child_env(keyed)["LLMGW_PAYLOAD_KEY_FILE"] == str(key_file)
    assert parse(["up", "--encrypt-payloads"]).encrypt_payloads
    assert not parse(["up"]).encrypt_payloads
