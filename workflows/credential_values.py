"""Credentials inside a value: a password in a URL, a bearer token, a key of a well-known shape.
Pure; used where a model is defined (workflows/catalog.py, through env_secrets.py and
arg_secrets.py), whatever the variable or flag is called: `DATABASE_URL=postgres://u:pw@db/x`
names no secret, yet its value is one, and a model definition is stored in workflow history.

Precise on purpose: paths, model names, numbers, hashes and URLs without a password pass. The
shapes are the issuers' documented prefixes, long enough that an ordinary word does not match.
"""

from __future__ import annotations

import re

# A letter or digit right before a prefix means the prefix is inside a longer word
# ("disk-…" holds "sk-"), not the start of a token.
_START = r"(?<![A-Za-z0-9_])"

# What each shape is, as the refusal names it; never the value itself.
_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # scheme://user:password@host: the password is the part between ':' and '@'.
    (
        "a URL with a password in it",
        re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@"),
    ),
    ("an HTTP bearer token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}")),
    # "Basic" alone is an ordinary word; after "Authorization:" it is a header's credentials.
    ("HTTP basic credentials", re.compile(r"(?i)authorization:\s*basic\s+\S+")),
    ("a Hugging Face token", re.compile(_START + r"hf_[A-Za-z0-9]{30,}")),
    ("an OpenAI or Anthropic API key", re.compile(_START + r"sk-[A-Za-z0-9_-]{20,}")),
    ("a GitHub token", re.compile(_START + r"(gh[pousr]_[A-Za-z0-9]{36,}|github_pat_\w{22,})")),
    ("an AWS access key id", re.compile(_START + r"(AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])")),
    ("a Google API key", re.compile(_START + r"AIza[0-9A-Za-z_-]{35}")),
    ("a Slack token", re.compile(_START + r"xox[abposr]-[A-Za-z0-9-]{10,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    (
        "a JSON web token",
        re.compile(_START + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ),
    # llmgw's own: a client API key (store/keyformat.py), an engine key, a join token.
    ("an llmgw API key", re.compile(_START + r"llmgw-[0-9a-f]{8}-[A-Za-z0-9_-]{43}")),
    ("an llmgw engine key", re.compile(_START + r"llmgw-engine-[0-9a-f]{64}")),
    ("an llmgw join token", re.compile(_START + r"llmgw-join-[A-Za-z0-9_=-]{16,}")),
)


def credential_in(value: str) -> str | None:
    """What kind of credential `value` holds ("a URL with a password in it"), or None."""
    for what, shape in _SHAPES:
        if shape.search(value):
            return what
    return None
