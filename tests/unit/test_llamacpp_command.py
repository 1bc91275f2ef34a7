"""llama-server's command line and environment: what `ps` on the node would show. That the real
build knows every flag: tests/e2e/test_llamacpp_flags.py."""

import pytest

from engines import llamacpp
from engines.llamacpp import engine_env
from workflows.contracts import LoraAdapter, ModelSpec, Profile

MODEL = ModelSpec(name="smollm2", weights="/models/SmolLM2-135M-Instruct.Q4_1.gguf")


def spec(**overrides: object) -> Profile:
    fields: dict[str, object] = {"context_size": 8192, "parallel": 4}
    fields.update(overrides)
    return Profile.model_validate(fields)


def command_line(binary: str, profile: Profile, host: str, port: int, threads: int) -> list[str]:
    return llamacpp.command_line(binary, MODEL, profile, host, port, threads)


def test_command_line_is_explicit_about_everything_llmgw_decides() -> None:
    argv = command_line("/e/llama-server", spec(), "127.0.0.1", 18001, 6)
    assert argv == [
        "/e/llama-server",
        "--host",
        "127.0.0.1",
        "--port",
        "18001",
        "--metrics",
        "-m",
        "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
        "--alias",
        "smollm2",
        "-c",
        "8192",
        "-np",
        "4",
        "-t",
        "6",
    ]


def test_operator_args_come_last() -> None:
    argv = command_line("llama-server", spec(args=["-fa", "on", "--temp", "0"]), "h", 1, 2)
    assert argv[-4:] == ["-fa", "on", "--temp", "0"]


def test_gpu_profile_offloads_every_layer() -> None:
    cpu = command_line("llama-server", spec(), "h", 1, 2)
    gpu = command_line("llama-server", spec(gpu_class="l4-22g", gpus_per_node=1), "h", 1, 2)
    assert "-ngl" not in cpu
    assert gpu[gpu.index("-ngl") + 1] == "999"


def test_lora_adapters_load_unapplied_in_order() -> None:
    lora = [LoraAdapter(name="sql", path="/a/sql.gguf"), LoraAdapter(name="fr", path="/a/fr.gguf")]
    argv = command_line("llama-server", spec(lora=lora, args=["-fa", "on"]), "h", 1, 2)
    # The index a request selects ("lora": [{"id": 0, ...}]) is the order given here.
    assert argv[-7:] == [
        "--lora",
        "/a/sql.gguf",
        "--lora",
        "/a/fr.gguf",
        "--lora-init-without-apply",
        "-fa",
        "on",
    ]


@pytest.mark.parametrize(
    "arg", ["--api-key", "--port", "--host=0.0.0.0", "-m", "--api-key-file", "--lora"]
)
def test_args_may_not_take_over_what_llmgw_sets(arg: str) -> None:
    with pytest.raises(ValueError, match="llmgw sets them itself"):
        command_line("llama-server", spec(args=[arg, "x"]), "127.0.0.1", 18001, 2)


def test_key_is_in_the_environment_never_on_argv() -> None:
    key = "llmgw-engine-0123abcd"
    argv = command_line("llama-server", spec(), "127.0.0.1", 18001, 2)
    assert all(key not in a for a in argv)
    assert engine_env(key) == {"LLAMA_API_KEY": key}
