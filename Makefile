# Switchyard: `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: setup test demo bench proto clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider $(ARGS)

demo: setup
	$(BIN)/python -m deploy.demo $(ARGS)

bench: setup
	$(BIN)/python -m bench $(ARGS)

proto: setup
	$(BIN)/python -m workers.cairn.proto_build

clean:
	rm -rf $(VENV) .pytest_cache
