"""No secret in a model definition, which is stored in workflow history: secret-looking engine
flags and credentials inside env and args values are refused when the model is defined, naming
the field and never repeating the value; ordinary values pass."""

import pytest

from workflows.catalog import check_profile
from workflows.contracts import Profile

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
OPENAI = "sk-proj-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4"
GITHUB = "ghp_" + "A" * 36
AWS = "AKIA" + "IOSFODNN7EXAMPLE"


def problems(*, args: list[str] | None = None, env: dict[str, str] | None = None) -> list[str]:
    return check_profile(Profile(engine="vllm", memory_mb=512, args=args or [], env=env or {}))


@pytest.mark.parametrize(
    ("args", "index", "flag"),
    [
        (["--hf-token", HF], 0, "--hf-token"),
        (["--hf-token=plainvalue"], 0, "--hf-token"),
        (["--max-num-batched-tokens", "8192", "--api-key", "abc"], 2, "--api-key"),
        (["--token", "abc"], 0, "--token"),
        (["--password=abc"], 0, "--password"),
        (["--secret", "abc"], 0, "--secret"),
        (["--wandb-key", "abc"], 0, "--wandb-key"),
        (["--admin_api_key", "abc"], 0, "--admin-api-key"),
    ],
)
def test_a_flag_that_takes_a_secret_is_refused_with_env_secret_advice(
    args: list[str], index: int, flag: str
) -> None:
    (problem,) = problems(args=args)
    assert problem.startswith(f"args[{index}]: {flag} takes a secret")
    assert "llmgw secret set" in problem
    assert "secret:" in problem
    values = [a.split("=", 1)[1] for a in args if "=" in a] + [a for a in args if a in (HF, "abc")]
    assert all(value not in problem for value in values)


def test_the_refusal_names_the_variable_the_engine_reads() -> None:
    (problem,) = problems(args=["--hf-token", "plainvalue"])
    assert "env HF_TOKEN: secret:hf-token" in problem
    assert "plainvalue" not in problem


def test_a_bare_switch_and_flags_that_only_look_alike_pass() -> None:
    assert (
        problems(
            args=[
                "--hf-token",  # alone: vLLM uses the node's cached login
                "--max-num-batched-tokens",
                "8192",
                "--tokenizer",
                "/models/tok",
                "--ssl-keyfile",
                "/etc/ssl/engine.key",
                "--kv-cache-dtype",
                "fp8",
                "--served-model-name-suffix",
                "-x",
            ]
        )
        == []
    )


def test_a_secret_reference_in_args_is_refused_with_why() -> None:
    (problem,) = problems(args=["--hf-token=secret:hf-token"])
    assert problem.startswith("args[0]: --hf-token takes a secret")
    (problem,) = problems(args=["--lora-modules", "secret:adapters"])
    assert problem.startswith("args[1]: secret references are resolved in env only")
    assert "every user of the node can read" in problem


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ("postgres://llmgw:hunter2@db.internal:5432/app", "a URL with a password in it"),
        ("https://:tokenvalue@hub.example/x", "a URL with a password in it"),
        ("Bearer abcdefghijklmnop", "an HTTP bearer token"),
        ("Authorization: Basic dXNlcjpwYXNz", "HTTP basic credentials"),
        (HF, "a Hugging Face token"),
        (OPENAI, "an OpenAI or Anthropic API key"),
        (GITHUB, "a GitHub token"),
        (AWS, "an AWS access key id"),
        ("-----BEGIN RSA PRIVATE KEY-----", "a private key"),
        ("llmgw-0123abcd-" + "A" * 43, "an llmgw API key"),
    ],
)
def test_a_credential_inside_a_value_is_refused_in_env_and_args(value: str, what: str) -> None:
    (env_problem,) = problems(env={"DATABASE_URL": value})
    assert env_problem.startswith(f"env.DATABASE_URL: the value holds {what}")
    assert "DATABASE_URL: secret:database-url" in env_problem
    assert value not in env_problem
    (arg_problem,) = problems(args=["--endpoint", value])
    assert arg_problem.startswith(f"args[1]: holds {what}")
    assert value not in arg_problem
    (inline,) = problems(args=[f"--endpoint={value}"])
    assert inline.startswith(f"args[0]: holds {what}")


@pytest.mark.parametrize(
    "value",
    [
        "/models/llama-3-8b-instruct/",
        "meta-llama/Llama-3.1-8B-Instruct",
        "hf_transfer",
        "8192",
        "0.9",
        "postgres://llmgw@db.internal:5432/app",  # a user, no password
        "http://10.0.0.2:8080/v1",
        "https://[::1]:8443/v1",
        "task-scheduler-with-a-rather-long-name",  # "sk-" inside a word
        "5d41402abc4b2a76b9719d911017c592",  # a hash
        "basic",
        "INFO",
    ],
)
def test_ordinary_values_pass(value: str) -> None:
    assert problems(env={"SOME_SETTING": value}, args=["--some-setting", value]) == []
