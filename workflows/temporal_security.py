"""How a process proves itself to a Temporal cluster: TLS, mutual TLS and API keys; and the key
it seals its payloads with (workflows/payload_codec.py), which the cluster never sees.

The settings hold file paths, never the secrets themselves: a private key or an API key is read
from its file at each connect (so a rotated file is picked up by the next process start or
reconnect) and handed to the client alone. Nothing here is logged or sent to a workflow, and
the dataclass's repr shows paths only.

A key file another user can read is refused, as node secrets are (docs/secrets.md). Unlike a
node secret, which llmgw writes itself, these files are put in place by an operator or an
orchestrator that usually shares them with the service's group (`root:llmgw 0640`, or a
Kubernetes secret volume with `fsGroup`): group read is allowed, other users are not.
"""

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from temporalio.service import TLSConfig

from workflows.payload_codec import PayloadKeys, read_payload_keys

# Each setting as an operator meets it: the flag and the variable (workers/temporal_flags.py).
CA_SETTING = "--temporal-tls-ca ($LLMGW_TEMPORAL_TLS_CA)"
CERT_SETTING = "--temporal-tls-cert ($LLMGW_TEMPORAL_TLS_CERT)"
KEY_SETTING = "--temporal-tls-key ($LLMGW_TEMPORAL_TLS_KEY)"
API_KEY_SETTING = "--temporal-api-key-file ($LLMGW_TEMPORAL_API_KEY_FILE)"


class TemporalSecurityError(ValueError):
    """A TLS or API-key setting that cannot work. The message names the setting and the file,
    never a secret's content."""


@dataclass(frozen=True)
class TemporalSecurity:
    # TLS with the system's trusted roots even when no file below is given (Temporal Cloud).
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    # The name the server's certificate is checked against (and sent as SNI), when it is not
    # the host in the address: a cluster reached by IP, or through a load balancer.
    server_name: str | None = None
    api_key_file: Path | None = None
    # Payloads encrypted with the keys in this file; None: payloads in clear. Not TLS: the
    # server never sees the key.
    payload_key_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            if self.key_file is None:
                given, missing = CERT_SETTING, KEY_SETTING
            else:
                given, missing = KEY_SETTING, CERT_SETTING
            raise TemporalSecurityError(
                f"{given} is set but {missing} is not: mutual TLS needs the client certificate "
                "and its private key"
            )
        if self.server_name is not None and not self.server_name.strip():
            raise TemporalSecurityError("the TLS server name is empty")

    @property
    def uses_tls(self) -> bool:
        """An API key travels only over TLS; any TLS file or name turns TLS on."""
        return self.tls or any(
            v is not None
            for v in (self.ca_file, self.cert_file, self.server_name, self.api_key_file)
        )

    def describe(self) -> str:
        """For logs and errors: what is used, never a secret."""
        parts = ["TLS"] if self.uses_tls else ["plaintext"]
        if self.cert_file is not None:
            parts.append("client certificate")
        if self.api_key_file is not None:
            parts.append("API key")
        if self.payload_key_file is not None:
            parts.append("encrypted payloads")
        return " + ".join(parts)

    def tls_config(self) -> TLSConfig | bool:
        """What the client's `tls=` takes; reads the files now."""
        if not self.uses_tls:
            return False
        if self.ca_file is None and self.cert_file is None and self.server_name is None:
            return True  # the system's roots, the address's host name
        return TLSConfig(
            server_root_ca_cert=_read_pem(self.ca_file, CA_SETTING, "CERTIFICATE"),
            domain=self.server_name,
            client_cert=_read_pem(self.cert_file, CERT_SETTING, "CERTIFICATE"),
            client_private_key=_read_private(self.key_file, KEY_SETTING),
        )

    def api_key(self) -> str | None:
        if self.api_key_file is None:
            return None
        text = _read_private(self.api_key_file, API_KEY_SETTING)
        assert text is not None
        try:
            key = text.decode("utf-8").strip()
        except UnicodeDecodeError:
            key = ""  # the error would quote a byte of the key
        if not key or any(ch.isspace() or not ch.isprintable() for ch in key):
            raise TemporalSecurityError(
                f"{API_KEY_SETTING}: {self.api_key_file} must hold one API key on one line"
            )
        return key

    def payload_keys(self) -> PayloadKeys | None:
        """Reads the payload key file now; raises PayloadKeyError (a ValueError) for a bad one."""
        return read_payload_keys(self.payload_key_file) if self.payload_key_file else None

    def check(self) -> None:
        """Read every file once, so that a process refuses bad settings at start rather than
        while retrying its connection."""
        self.tls_config()
        self.api_key()
        self.payload_keys()


def _read(path: Path, setting: str) -> tuple[bytes, int]:
    try:
        with path.open("rb") as file:
            return file.read(), os.fstat(file.fileno()).st_mode
    except FileNotFoundError:
        raise TemporalSecurityError(f"{setting}: {path} does not exist") from None
    except IsADirectoryError:
        raise TemporalSecurityError(f"{setting}: {path} is a directory, not a file") from None
    except OSError as err:
        raise TemporalSecurityError(f"{setting}: cannot read {path}: {err.strerror}") from None


def _read_pem(path: Path | None, setting: str, kind: str) -> bytes | None:
    if path is None:
        return None
    data, _ = _read(path, setting)
    if f"-----BEGIN {kind}-----".encode() not in data:
        raise TemporalSecurityError(f"{setting}: {path} holds no PEM {kind.lower()}")
    return data


def _read_private(path: Path | None, setting: str) -> bytes | None:
    if path is None:
        return None
    data, mode = _read(path, setting)
    if mode & stat.S_IRWXO:
        raise TemporalSecurityError(
            f"{setting}: {path} is readable by other users (mode {stat.S_IMODE(mode):o}); "
            f"chmod o-rwx {path}"
        )
    if setting == KEY_SETTING and b"PRIVATE KEY-----" not in data:
        raise TemporalSecurityError(f"{setting}: {path} holds no PEM private key")
    return data
