# Two commands on a fresh machine: `make demo` and `make test` (`make lint` and
# `make test-timing` for CI).
# Each creates .venv if it is missing and installs autotm into it, the CPU build of torch first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-timing lint install clean

$(BIN)/.autotm-installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# the CPU build first: a bare `torch` requirement would pull a multi-GB CUDA build
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)" || $(BIN)/pip install -q "torch>=2.4"
	@# the models extra (torchvision, transformers) with torch pinned to the build installed:
	@# torchvision's minor version is torch's + 15 (torch 2.13 -> torchvision 0.28); pip may
	@# not replace torch, and if it did anyway, stop here
	@$(BIN)/python -c "import torch; print(torch.__version__)" > $(VENV)/torch-before.txt
	@$(BIN)/python -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > $(VENV)/torch-constraint.txt
	@$(BIN)/pip install -q -c $(VENV)/torch-constraint.txt -e '.[test,models,lint]' \
		"torchvision==$$($(BIN)/python -c "import torch; v = torch.__version__.split('+')[0].split('.'); print(f'0.{int(v[1]) + 15}.*')")"
	@$(BIN)/python -c "import torch; print(torch.__version__)" | cmp -s - $(VENV)/torch-before.txt || \
		{ echo "pip replaced torch $$(cat $(VENV)/torch-before.txt) with $$($(BIN)/python -c 'import torch; print(torch.__version__)')"; exit 1; }
	@# the executor's C++ arena allocator (tiers/cpu_arena.py), built once into the user's cache
	@echo "building the CPU arena allocator (once, ~30 s) ..."
	@$(BIN)/python -c "from autotm.tiers import cpu_arena; cpu_arena.load() or print('not built:', cpu_arena.load.reason)"
	@touch $@

install: $(BIN)/.autotm-installed

demo: install
	$(BIN)/autotm demo

test: install
	$(BIN)/python -m pytest -q -m "not timing"

# asserts on measured times: they can fail on a loaded machine, so they run apart
test-timing: install
	$(BIN)/python -m pytest -q -m timing

lint: install
	$(BIN)/python -m ruff check src tests benchmarks
	$(BIN)/python -m mypy

clean:
	rm -rf $(VENV) results .pytest_cache
