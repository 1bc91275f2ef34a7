"""What `llmgw mirror add SOURCE` can name, parsed without touching anything (pure).

- a local file or directory: `/path/model.gguf`, `./dir`, `~/models/x` (anything without `://`);
- one file over HTTP(S): `https://host/path/model.gguf[#sha256=<hex>]`;
- a Hugging Face-layout repository: `hf://ORG/REPO[@REVISION][/FILE[,FILE...]]` (several files
  are separated by commas, which no artifact path may hold);
- a model in Ollama's store: `ollama://NAME[:TAG]`.

A URL's user name and password, query and fragment never reach `public` (what a manifest records
as its source): a query can hold a signature as secret as a password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from workflows.artifact_names import BadArtifact, check_relative_path

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
DEFAULT_HF_REVISION = "main"
_HEX = re.compile(r"^[0-9a-fA-F]{64}$")
_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HF_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class BadSource(ValueError):
    """A SOURCE string that names nothing the mirror can read, and why."""


@dataclass(frozen=True)
class LocalSource:
    path: str

    @property
    def public(self) -> str:
        return self.path


@dataclass(frozen=True)
class UrlSource:
    url: str  # as given, credentials included (httpx sends them), fragment removed
    sha256: str | None  # "sha256:<hex>" the file must hash to, when known

    @property
    def public(self) -> str:
        return public_url(self.url)


@dataclass(frozen=True)
class HfSource:
    endpoint: str  # no trailing "/"
    repo: str  # ORG/REPO
    revision: str
    files: tuple[str, ...]  # empty: every file the repository lists

    @property
    def public(self) -> str:
        """`hf://ORG/REPO@REVISION`, and `via ENDPOINT` when it is not the Hub."""
        via = "" if self.endpoint == DEFAULT_HF_ENDPOINT else f" via {public_url(self.endpoint)}"
        return f"hf://{self.repo}@{self.revision}{via}"


@dataclass(frozen=True)
class OllamaSource:
    # NAME[:TAG], checked by workers/ollama_store.parse_reference when the store is read (the
    # Ollama reader lives in workers/, above this package).
    reference: str

    @property
    def public(self) -> str:
        return f"ollama:{self.reference}"


Source = LocalSource | UrlSource | HfSource | OllamaSource


def normal_sha256(text: str) -> str:
    """`<hex>` or `sha256:<hex>` as the mirror's "sha256:<lowercase hex>"."""
    hexpart = text[len("sha256:") :] if text.lower().startswith("sha256:") else text
    if not _HEX.match(hexpart):
        raise BadSource(f"{text[:80]!r} is not a sha256 digest (64 hex digits)")
    return "sha256:" + hexpart.lower()


def public_url(url: str) -> str:
    """The URL without user name, password, query or fragment: safe to record and print."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal loses its brackets in .hostname
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def parse_source(text: str, sha256: str | None = None, hf_endpoint: str | None = None) -> Source:
    """The source `text` names. `sha256` (the `--sha256` option) applies to a URL only;
    `hf_endpoint` (the `--hf-endpoint` option or $HF_ENDPOINT) to `hf://` only."""
    if not text.strip():
        raise BadSource(
            "SOURCE is empty: give a file, a directory, a URL, hf://... or ollama://..."
        )
    expected = normal_sha256(sha256) if sha256 else None
    scheme, sep, rest = text.partition("://")
    if not sep:
        if expected:
            raise BadSource("--sha256 checks one downloaded file: give it with an http(s) URL")
        return LocalSource(text)
    scheme = scheme.lower()
    if scheme in ("http", "https"):
        return _url_source(text, expected)
    if expected:
        raise BadSource("--sha256 checks one downloaded file: give it with an http(s) URL")
    if scheme == "hf":
        return _hf_source(rest, hf_endpoint or DEFAULT_HF_ENDPOINT)
    if scheme == "ollama":
        if not rest or rest.startswith("/"):
            raise BadSource(f"{text!r}: give ollama://NAME[:TAG]")
        return OllamaSource(rest)
    raise BadSource(
        f"{text[:100]!r}: unknown scheme {scheme!r} (a path, http(s)://, hf:// or ollama://)"
    )


def _url_source(text: str, expected: str | None) -> UrlSource:
    url, _, fragment = text.partition("#")
    parts = urlsplit(url)
    if not parts.hostname:
        raise BadSource(f"{public_url(url)!r} has no host")
    if fragment:
        key, eq, value = fragment.partition("=")
        if key != "sha256" or not eq:
            raise BadSource(f"URL fragment #{fragment[:80]} is not #sha256=<hex>")
        from_url = normal_sha256(value)
        if expected and expected != from_url:
            raise BadSource(f"--sha256 {expected} and the URL's #sha256={from_url} disagree")
        expected = from_url
    return UrlSource(url=url, sha256=expected)


def check_endpoint(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadSource(f"Hugging Face endpoint {public_url(endpoint)!r} is not an http(s) URL")
    if parts.query or parts.fragment:
        raise BadSource("the Hugging Face endpoint takes no query or fragment")
    return endpoint.rstrip("/")


def _hf_source(rest: str, endpoint: str) -> HfSource:
    parts = rest.split("/", 2)
    if len(parts) < 2:
        raise BadSource(f"hf://{rest[:100]}: give hf://ORG/REPO[@REVISION][/FILE[,FILE...]]")
    org, repo_rev = parts[0], parts[1]
    repo, at, revision = repo_rev.partition("@")
    if at and not revision:
        raise BadSource(f"hf://{rest[:100]}: empty revision after '@'")
    revision = revision or DEFAULT_HF_REVISION
    for what, value, rule in (
        ("organisation", org, _HF_PART),
        ("repository", repo, _HF_PART),
        ("revision", revision, _HF_REVISION),
    ):
        if not rule.match(value) or ".." in value:
            raise BadSource(f"hf://{rest[:100]}: {what} {value[:100]!r} is not a valid name")
    files: tuple[str, ...] = ()
    if len(parts) == 3:
        try:
            files = tuple(check_relative_path(f) for f in parts[2].split(","))
        except BadArtifact as err:
            raise BadSource(f"hf://{rest[:100]}: {err}") from None
    return HfSource(check_endpoint(endpoint), f"{org}/{repo}", revision, files)
