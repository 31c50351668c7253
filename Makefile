# dspark developer entry points. `make demo` and `make test` work on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the training extra's torch: 2.13.0 is a CPU build (~750 MB installed, ~25 s from the local wheel cache)
TORCH ?= 2.13.0
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: install engine demo test clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,train]' 'torch==$(TORCH)'
	touch $@

# CPU llama.cpp build (with the RPC backend: the rpc tests need ggml-rpc-server), cached under the user
# cache dir keyed by commit+backend+rpc (a rerun reuses it). One build serves every test.
engine: install
	$(BIN)/dspark engine build --backend cpu --jobs $(JOBS)

demo: engine
	DSPARK=$(BIN)/dspark scripts/demo.sh

test: engine
	$(BIN)/python -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
