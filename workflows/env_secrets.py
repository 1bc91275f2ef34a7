"""Secret values in a profile's env, referenced by name. Pure; used where a model is defined
(workflows/catalog.py) and by the agent at launch (activities/agent/node_secrets.py resolves them).

A model definition travels in every replica's and model's workflow history, where anyone with
the Temporal UI reads it. So a token (HF_TOKEN, WANDB_API_KEY) is never written there: the env
value is `secret:NAME`, and each node's agent reads NAME from its own secrets directory when
it starts the engine (`llmgw secret set NAME` on the node; docs/secrets.md). A plain value for
a variable whose name says it is a secret is refused, with how to reference one instead, and so
is a value holding a credential whatever its name (workflows/credential_values.py).
"""

from __future__ import annotations

import re

from workflows.credential_values import credential_in

SECRET_PREFIX = "secret:"  # noqa: S105 (a marker, not a password)
SECRET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
# HF_TOKEN, HUGGING_FACE_HUB_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, ...;
# not NCCL_IB_PKEY or HF_TOKEN_PATH (a path, not a token).
_LOOKS_SECRET = re.compile(
    r"(^|_)(TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?)$|(^|_)SECRET_|PASSWORD"
)


def secret_ref(value: str) -> str | None:
    """The secret's name when `value` references one, else None (a plain value)."""
    return value[len(SECRET_PREFIX) :] if value.startswith(SECRET_PREFIX) else None


def looks_secret(name: str) -> bool:
    return bool(_LOOKS_SECRET.search(name.upper()))


def env_value_problem(name: str, value: str) -> str | None:
    """Why a profile may not give `name` this value, or None. Never repeats the value."""
    ref = secret_ref(value)
    if ref is not None:
        if not SECRET_NAME.match(ref):
            return (
                f"secret name {ref!r} must be lower-case letters, digits, '.', '_' or '-' "
                "(at most 63, starting with a letter or digit)"
            )
        return None
    if looks_secret(name) and value:
        return (
            "looks like a secret, and a model definition is stored in workflow history: keep "
            f"the value on each node (`llmgw secret set {suggested_name(name)}`) and write "
            f"{name}: {SECRET_PREFIX}{suggested_name(name)}"
        )
    found = credential_in(value)
    if found is not None:
        return (
            f"the value holds {found}, and a model definition is stored in workflow history: "
            f"put the whole value on each node (`llmgw secret set {suggested_name(name)}`) and "
            f"write {name}: {SECRET_PREFIX}{suggested_name(name)}"
        )
    return None


def suggested_name(env_name: str) -> str:
    """HF_TOKEN -> hf-token: the secret's name the refusal suggests."""
    return re.sub(r"[^a-z0-9]+", "-", env_name.lower()).strip("-") or "secret"
