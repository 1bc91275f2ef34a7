"""Secrets in a profile's engine `args`, refused. Pure; used where a model is defined
(workflows/catalog.py names the argument at fault).

`args` travel with the model definition in workflow history, as `env` does, so a flag that
takes a secret (`--hf-token hf_…`, `--api-key …`) is refused, and so is a credential inside any
argument (workflows/credential_values.py). Unlike `env`, a `secret:NAME` reference is refused
here too rather than resolved on the node: a process's command line is readable by every user
of the machine (`ps`, /proc/PID/cmdline), its environment only by its own user. The refusal
says to pass the secret through `env` instead, which every engine reads its hub token from.
"""

from __future__ import annotations

import re

from workflows.credential_values import credential_in
from workflows.env_secrets import SECRET_PREFIX, suggested_name

# --api-key, --hf-token, --token, --password, --secret, --admin-api-key, --aws_secret_key, ...;
# not --api-key-file or --ssl-keyfile (paths), nor --max-tokens or --tokenizer.
_SECRET_FLAG = re.compile(
    r"^--?([a-z0-9]+-)*(key|token|secret|password|passwd|passphrase|credentials?|auth)$"
)


def _flag_name(arg: str) -> str | None:
    """`--hf-token` of `--hf-token` and `--hf-token=…`; None when `arg` is not a flag."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
        return None  # a value, or a negative number
    return arg.split("=", 1)[0].lower().replace("_", "-")


def secret_flag(arg: str) -> bool:
    name = _flag_name(arg)
    return name is not None and bool(_SECRET_FLAG.match(name))


def args_problems(args: list[str]) -> list[str]:
    """Problems as "args[i]: why", never repeating a value."""
    problems: list[str] = []
    refused_value = False
    for index in range(len(args)):
        if refused_value:  # the value of a secret flag refused just before: one problem
            refused_value = False
            continue
        problem = _arg_problem(args, index)
        if problem is not None:
            problems.append(f"args[{index}]: {problem}")
            refused_value = secret_flag(args[index]) and "=" not in args[index]
    return problems


def _arg_problem(args: list[str], index: int) -> str | None:
    arg = args[index]
    if secret_flag(arg):
        flag = _flag_name(arg)
        assert flag is not None
        given = "=" in arg or (index + 1 < len(args) and _flag_name(args[index + 1]) is None)
        if given:
            return (
                f"{flag} takes a secret, and a model definition is stored in workflow history: "
                f"give it to the engine through env instead ({_env_advice(flag)})"
            )
        return None  # a bare switch (vLLM's `--hf-token` alone uses the node's cached login)
    if arg.startswith(SECRET_PREFIX) or f"={SECRET_PREFIX}" in arg:
        return (
            "secret references are resolved in env only, not on a command line, which every "
            f"user of the node can read: {_env_advice(_flag_before(args, index))}"
        )
    found = credential_in(arg)
    if found is not None:
        return (
            f"holds {found}, and a model definition is stored in workflow history: give it "
            f"through env instead ({_env_advice(_flag_before(args, index))})"
        )
    return None


def _flag_before(args: list[str], index: int) -> str:
    """The flag `args[index]` is the value of (`--x=v` or `--x v`), or "" for none."""
    own = _flag_name(args[index])
    if own is not None:
        return own
    before = _flag_name(args[index - 1]) if index > 0 else None
    return before or ""


def _env_advice(flag: str) -> str:
    """HF_TOKEN: secret:hf-token for --hf-token, with where the value goes."""
    variable = re.sub(r"[^A-Z0-9]+", "_", flag.lstrip("-").upper()).strip("_") or "NAME"
    name = suggested_name(variable) if variable != "NAME" else "name"
    return (
        f"`llmgw secret set {name}` on each node, then env {variable}: {SECRET_PREFIX}{name} "
        "if the engine reads that variable"
    )
