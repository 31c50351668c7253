# dspark developer entry points. `make demo` and `make test` work on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the training extra's torch: 2.13.0 is a CPU build (~750 MB installed, ~25 s from the local wheel cache)
TORCH ?= 2.13.0
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: install install-demo engine engine-stock demo test test-fast lint clean

# what the demo needs: dspark and its runtime dependencies (no torch, no test tools)
install-demo: $(VENV)/.installed-base

$(VENV)/.installed-base: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

# what the tests need besides: the test tools and the training extra (torch, CPU build)
install: $(VENV)/.installed

$(VENV)/.installed: $(VENV)/.installed-base
	$(BIN)/pip install -q -e '.[test,train]' 'torch==$(TORCH)'
	touch $@

# CPU llama.cpp build (with the RPC backend: the rpc tests need ggml-rpc-server), cached under the user
# cache dir (or DSPARK_ENGINE_DIR) keyed by commit+backend+rpc+patches (a rerun reuses it). One build serves
# the demo and every test.
engine: install-demo
	$(BIN)/dspark engine build --backend cpu --jobs $(JOBS)

# the same commit without dspark's patches: tests/test_ngram_stock.py compares n-gram drafts against it (a
# failure, not a skip, without it), so `make test` builds it once too (a rerun reuses it)
engine-stock: install-demo
	$(BIN)/dspark engine build --backend cpu --jobs $(JOBS) --no-patches

demo: install-demo engine
	DSPARK=$(BIN)/dspark PYTHON=$(BIN)/python scripts/demo.sh

test: install engine engine-stock
	$(BIN)/python -m pytest -q -p no:cacheprovider

# the editing lane: no engine, no study kit, no torch, no wall-clock bounds (< 60 s on 2 cores); the lanes are
# marked in tests/conftest.py. It needs no `make engine` and finds none if there is one (conftest.hide_engine:
# it runs as a newcomer's machine). The GGUF fuzz runs 1,000 examples here (10,000 in `make test`);
# DSPARK_TEST_CLI=subprocess runs every `cli` call as a new `dspark` process.
FAST := not engine and not study and not torch and not timing
test-fast: install
	DSPARK_FUZZ_EXAMPLES=$${DSPARK_FUZZ_EXAMPLES:-1000} $(BIN)/python -m pytest -q -p no:cacheprovider -m '$(FAST)'

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
