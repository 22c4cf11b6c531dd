# Switchyard: `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=
# xdist workers: the tests mostly wait on services, so more than the 2 cores (docs/TESTING.md). With
# 8 the suite ran up to 20 s faster; 6 stays until 8 has green runs of its own (docs/BENCHMARKS.md).
TEST_WORKERS  ?= 6
CHECK_WORKERS ?= 6
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider
# Write bytecode: otherwise every xdist worker and fleet process compiles the project again.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup bytecode lint check test demo stack bench proto clean

setup: $(STAMP)

# uv installs the same packages as pip in about half the time on a cold cache (docs/DESIGN.md
# "Ground rules"); pip, if uv cannot be had. Neither compiles the venv: devstack.infra.warm
# writes the bytecode of what runs. mypy fills its cache, so lint checks only what changed since
# (0.6 s, not 17 s on 2 cores); its findings are lint's to report.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv && $(BIN)/python -m uv pip install --python $(BIN)/python --quiet \
		-e '.[dev]' || { $(BIN)/python -m pip install --quiet --upgrade pip && \
		$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'; }
	$(BIN)/python -m devstack.infra.warm
	@$(BIN)/python -m mypy > /dev/null || true
	@touch $(STAMP)

# Compile the project once before pytest, not once per worker and fleet process.
bytecode: setup
	$(BIN)/python -m compileall -q -j 0 tasks workers bridges ops devstack bench tests/kit

# ruff, then mypy over everything but the test modules ([tool.mypy] in pyproject.toml).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/python -m mypy

# The edit loop's tier: lint, then every test that starts no fleet process and loads no model.
check: lint bytecode
	$(PYTEST) -m "not slow and not model" -n $(CHECK_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

# Everything, as CI runs it (.ci/run): lint, then the whole suite.
test: lint bytecode
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

demo: setup
	$(BIN)/python -m devstack.demo $(ARGS)

# The embedded services and the .env a local `honcho start` reads, until Ctrl-C (docs/operations.md 2.1).
stack: setup
	$(BIN)/python -m devstack.serve $(ARGS)

bench: setup
	$(BIN)/python -m bench $(ARGS)

proto: setup
	$(BIN)/python -m workers.cairn.contract.proto_build

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
