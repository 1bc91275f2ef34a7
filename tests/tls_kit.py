"""Certificates and a mutual-TLS front for tests.

`temporal server start-dev` serves plaintext only (it has no TLS flags), so a test that wants a
Temporal behind TLS puts this proxy in front of a real dev server: it terminates TLS, demands a
client certificate signed by the test CA (as a cluster configured for mTLS does), and relays the
decrypted HTTP/2 bytes to the dev server unchanged.
"""

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


class TestCA:
    """A certificate authority of the test's own, issuing server and client certificates."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "llmgw test CA") -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.cert_file = directory / f"{name.replace(' ', '-')}.pem"
        self.cert_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, *, server_names: list[str] | None = None) -> Issued:
        """A server certificate for `server_names` (DNS names or IPs), else a client one."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server_names:
            alt: list[x509.GeneralName] = []
            for name in server_names:
                try:
                    alt.append(x509.IPAddress(ipaddress.ip_address(name)))
                except ValueError:
                    alt.append(x509.DNSName(name))
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
            usage = ExtendedKeyUsageOID.SERVER_AUTH
        else:
            usage = ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        stem = self.directory / common_name
        cert_file, key_file = stem.with_suffix(".pem"), stem.with_suffix(".key")
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_file, key)
        return Issued(cert_file, key_file)


@dataclass
class MutualTLSProxy:
    """TLS on `port` (requiring a client certificate from `client_ca`), relayed in the clear to
    `upstream` ("host:port"). Records the common name of every client that completed a
    handshake: one that did not never reaches the upstream."""

    upstream: str
    server: Issued
    client_ca: Path
    port: int = 0
    clients: list[str] = field(default_factory=list)
    _server: asyncio.Server | None = None

    async def __aenter__(self) -> "MutualTLSProxy":
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.server.cert, self.server.key)
        context.load_verify_locations(self.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols(["h2"])
        self._server = await asyncio.start_server(
            self._relay, "127.0.0.1", self.port, ssl=context, ssl_handshake_timeout=10
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert") or {}
        subject = dict(item for rdn in peer.get("subject", ()) for item in rdn)
        self.clients.append(str(subject.get("commonName", "")))
        host, port = self.upstream.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(ConnectionError, ssl.SSLError, RuntimeError):
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
