# Switchyard: `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=
# pytest-xdist workers. Most slow tests wait on fleet processes, so more workers than the
# 2 cores of the reference box pay off; measured in README "Tests".
TEST_WORKERS  ?= 4
CHECK_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider

.PHONY: setup lint check test demo bench proto clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

lint: setup
	$(BIN)/ruff check .

# The edit loop's tier: lint, then every test that starts no fleet process and loads no model.
check: lint
	$(PYTEST) -m "not slow and not model" -n $(CHECK_WORKERS) $(ARGS)

# Everything, as CI runs it (.ci/run): lint, then the whole suite.
test: lint
	$(PYTEST) -n $(TEST_WORKERS) --dist loadgroup $(ARGS)

demo: setup
	$(BIN)/python -m deploy.demo $(ARGS)

bench: setup
	$(BIN)/python -m bench $(ARGS)

proto: setup
	$(BIN)/python -m workers.cairn.proto_build

clean:
	rm -rf $(VENV) .pytest_cache
