"""A Hugging Face-layout repository through any endpoint that speaks its two calls (the Hub
itself, or an HF_ENDPOINT-style mirror):

    GET {endpoint}/api/models/{org}/{repo}/revision/{revision}  ->  {"sha": ..., "siblings":
        [{"rfilename": "config.json"}, ...]}
    GET {endpoint}/{org}/{repo}/resolve/{revision}/{file}       ->  the file (often a redirect)

The token is taken by reference (an environment variable's name or a file's path), read when
the add runs, and sent only as an Authorization header: it is never part of a URL, a manifest,
a ref or a message. httpx drops that header when a redirect leaves the endpoint's origin.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import quote

import httpx

from activities.control.mirror.errors import MirrorError
from activities.control.mirror.http_download import Download
from activities.control.mirror.sources import HfSource
from workflows.artifact_names import BadArtifact, check_relative_path

MAX_LISTING_BYTES = 16 << 20
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def read_token(env_name: str | None, file: str | None, env: dict[str, str]) -> str | None:
    """The token a `--hf-token-env VAR` or `--hf-token-file FILE` names; None: no token."""
    if env_name and file:
        raise MirrorError("give --hf-token-env or --hf-token-file, not both")
    if env_name:
        token = env.get(env_name, "").strip()
        if not token:
            raise MirrorError(f"--hf-token-env {env_name}: that environment variable is unset")
        return token
    if file:
        try:
            token = Path(file).expanduser().read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise MirrorError(f"--hf-token-file {file}: cannot read it ({err})") from None
        if not token:
            raise MirrorError(f"--hf-token-file {file} is empty")
        return token
    return None


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def resolved_revision(source: HfSource, listing: dict[str, object]) -> str:
    """The commit the listing names, so every file comes from one commit even when a branch
    moves during the add; the revision as given when the endpoint names none."""
    sha = listing.get("sha")
    return sha if isinstance(sha, str) and _COMMIT.match(sha) else source.revision


def list_repository(
    client: httpx.Client, source: HfSource, token: str | None
) -> tuple[str, list[str]]:
    """(the revision to fetch, the repository's files) from the endpoint's listing."""
    url = f"{source.endpoint}/api/models/{source.repo}/revision/{quote(source.revision, safe='')}"
    what = f"the file list of hf://{source.repo}@{source.revision}"
    try:
        resp = client.get(url, headers=auth_headers(token))
    except httpx.HTTPError as err:
        raise MirrorError(f"{what}: {type(err).__name__}: {err}") from None
    if resp.status_code >= 400:
        hint = " (a private or gated repository needs --hf-token-env or --hf-token-file)"
        raise MirrorError(
            f"{what}: HTTP {resp.status_code}{hint if resp.status_code in (401, 403) else ''}"
        )
    if len(resp.content) > MAX_LISTING_BYTES:
        raise MirrorError(f"{what} is larger than {MAX_LISTING_BYTES} bytes: refused")
    try:
        doc = resp.json()
    except ValueError:
        raise MirrorError(f"{what} is not JSON") from None
    siblings = doc.get("siblings") if isinstance(doc, dict) else None
    if not isinstance(siblings, list):
        raise MirrorError(f"{what} has no siblings list")
    names = []
    for entry in siblings:
        name = entry.get("rfilename") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise MirrorError(f"{what}: a sibling without an rfilename")
        try:
            names.append(check_relative_path(name))
        except BadArtifact as err:
            raise MirrorError(f"{what}: {err}") from None
    if not names:
        raise MirrorError(f"{what}: the repository lists no files")
    return resolved_revision(source, doc), sorted(names)


def file_download(source: HfSource, revision: str, path: str, token: str | None) -> Download:
    url = f"{source.endpoint}/{source.repo}/resolve/{quote(revision, safe='')}/{path}"
    return Download(
        url=url,
        what=f"hf://{source.repo}@{revision}/{path}",
        headers=auth_headers(token),
    )


def token_from_options(env_name: str | None, file: str | None) -> str | None:
    return read_token(env_name, file, dict(os.environ))
