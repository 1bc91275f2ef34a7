"""How a command's flags and variables become its Temporal connection settings, and how bad
settings are refused: without a server (tests/integration/test_temporal_tls.py connects)."""

import argparse
from pathlib import Path

import pytest
from temporalio.service import TLSConfig

from tests.tls_kit import TestCA
from workers.cli import build_parser, locations, main
from workers.paths import Locations
from workers.temporal_flags import security_from
from workers.up import child_env
from workflows.temporal_security import TemporalSecurity, TemporalSecurityError

API_KEY = "tc-live-0123456789abcdef"


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "temporal.key"
    path.write_text(API_KEY + "\n")
    path.chmod(0o640)  # the service's group may read it, as with root:llmgw 0640
    return path


def test_no_settings_mean_plaintext() -> None:
    security = security_from(parse(["status"]), {})
    assert not security.uses_tls
    assert security.tls_config() is False
    assert security.api_key() is None


def test_tls_alone_uses_the_system_roots() -> None:
    assert security_from(parse(["status", "--temporal-tls"]), {}).tls_config() is True
    assert security_from(None, {"LLMGW_TEMPORAL_TLS": "yes"}).tls_config() is True


def test_mutual_tls_from_variables_reads_every_file(ca: TestCA) -> None:
    client = ca.issue("llmgw-agent")
    env = {
        "LLMGW_TEMPORAL_TLS_CA": str(ca.cert_file),
        "LLMGW_TEMPORAL_TLS_CERT": str(client.cert),
        "LLMGW_TEMPORAL_TLS_KEY": str(client.key),
        "LLMGW_TEMPORAL_TLS_SERVER_NAME": "temporal.internal",
    }
    tls = security_from(parse(["agent"]), env).tls_config()
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == ca.cert_file.read_bytes()
    assert tls.client_cert == client.cert.read_bytes()
    assert tls.client_private_key == client.key.read_bytes()
    assert tls.domain == "temporal.internal"


def test_a_flag_wins_over_its_variable(ca: TestCA, tmp_path: Path) -> None:
    other = TestCA(tmp_path, name="flag CA")
    args = parse(["gateway", "--temporal-tls-ca", str(other.cert_file)])
    tls = security_from(args, {"LLMGW_TEMPORAL_TLS_CA": str(ca.cert_file)}).tls_config()
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == other.cert_file.read_bytes()


def test_an_api_key_comes_from_its_file_and_turns_tls_on(key_file: Path) -> None:
    security = security_from(parse(["control", "--temporal-api-key-file", str(key_file)]), {})
    assert security.api_key() == API_KEY
    assert security.tls_config() is True
    # What may be logged or shown names the file at most, never the key.
    assert API_KEY not in security.describe()
    assert API_KEY not in repr(security)
    assert API_KEY not in repr(Locations.resolve(security=security))


def test_an_api_key_in_a_variable_is_refused_with_the_way_to_give_it() -> None:
    with pytest.raises(TemporalSecurityError, match="LLMGW_TEMPORAL_API_KEY_FILE") as caught:
        security_from(parse(["status"]), {"LLMGW_TEMPORAL_API_KEY": API_KEY})
    assert API_KEY not in str(caught.value)


def test_a_certificate_without_its_key_is_refused(ca: TestCA) -> None:
    client = ca.issue("llmgw-gateway")
    with pytest.raises(TemporalSecurityError, match=r"--temporal-tls-key .* is not"):
        security_from(parse(["gateway", "--temporal-tls-cert", str(client.cert)]), {})
    with pytest.raises(TemporalSecurityError, match=r"--temporal-tls-cert .* is not"):
        security_from(None, {"LLMGW_TEMPORAL_TLS_KEY": str(client.key)})


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "ca.pem"
    security = security_from(parse(["status", "--temporal-tls-ca", str(missing)]), {})
    with pytest.raises(TemporalSecurityError, match=f"--temporal-tls-ca .*{missing} does not"):
        security.check()


def test_a_file_of_the_wrong_kind_is_refused(ca: TestCA, tmp_path: Path) -> None:
    client = ca.issue("llmgw-control")
    swapped = TemporalSecurity(cert_file=client.key, key_file=client.cert)
    with pytest.raises(TemporalSecurityError, match="holds no PEM certificate"):
        swapped.check()
    with pytest.raises(TemporalSecurityError, match="is a directory"):
        TemporalSecurity(ca_file=tmp_path).check()


def test_a_key_other_users_can_read_is_refused(ca: TestCA, key_file: Path) -> None:
    client = ca.issue("llmgw-control")
    client.key.chmod(0o644)
    with pytest.raises(TemporalSecurityError, match=r"readable by other users .*644"):
        TemporalSecurity(cert_file=client.cert, key_file=client.key).check()
    key_file.chmod(0o604)
    with pytest.raises(TemporalSecurityError, match="readable by other users"):
        TemporalSecurity(api_key_file=key_file).check()


@pytest.mark.parametrize("content", ["", "\n", "two\nlines\n", "has space"])
def test_an_api_key_file_holds_one_key_on_one_line(tmp_path: Path, content: str) -> None:
    path = tmp_path / "key"
    path.write_text(content)
    path.chmod(0o600)
    with pytest.raises(TemporalSecurityError, match="one API key on one line"):
        TemporalSecurity(api_key_file=path).api_key()


def test_tls_turned_off_while_tls_files_are_set_is_refused(key_file: Path) -> None:
    env = {"LLMGW_TEMPORAL_TLS": "0", "LLMGW_TEMPORAL_API_KEY_FILE": str(key_file)}
    with pytest.raises(TemporalSecurityError, match="only over TLS"):
        security_from(None, env)
    with pytest.raises(TemporalSecurityError, match="use 1 or 0"):
        security_from(None, {"LLMGW_TEMPORAL_TLS": "maybe"})


def test_the_namespace_comes_from_the_flag_then_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLMGW_TEMPORAL_NAMESPACE", "from-env")
    assert locations(parse(["status"])).namespace == "from-env"
    assert locations(parse(["status", "--temporal-namespace", "flag"])).namespace == "flag"


def test_the_cli_stops_at_once_with_the_setting_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_TEMPORAL_TLS_CA", str(tmp_path / "absent.pem"))
    with pytest.raises(SystemExit, match="Temporal connection settings: --temporal-tls-ca"):
        main(["control", "--state-dir", str(tmp_path)])


def test_commands_that_never_connect_ignore_the_tls_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_TEMPORAL_TLS_CA", str(tmp_path / "absent.pem"))
    where = locations(parse(["secret", "ls", "--state-dir", str(tmp_path)]))
    assert not where.security.uses_tls


def test_up_keeps_its_children_off_a_clusters_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    """`up`'s children talk to its own plaintext dev server."""
    monkeypatch.setenv("LLMGW_TEMPORAL_TLS_CA", "/etc/llmgw/ca.pem")
    monkeypatch.setenv("LLMGW_TEMPORAL_API_KEY_FILE", "/etc/llmgw/temporal.key")
    where = locations(parse(["up"]))
    assert not where.security.uses_tls
    env = child_env(where)
    assert "LLMGW_TEMPORAL_TLS_CA" not in env
    assert "LLMGW_TEMPORAL_API_KEY_FILE" not in env
