# Switchyard: `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=
# xdist workers: the tests mostly wait on services, so more than the 2 cores (docs/TESTING.md). 8 and
# 10 ran no faster than 6 beyond the box's own ±20 s (docs/BENCHMARKS.md), so 6 stays.
TEST_WORKERS  ?= 6
CHECK_WORKERS ?= 6
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider
# Write bytecode: otherwise every xdist worker and fleet process compiles the project again.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup bytecode lint check test demo stack bench proto clean

setup: $(STAMP)

# uv installs the same packages as pip in about half the time on a cold cache (docs/DESIGN.md
# "Ground rules"); pip, if uv cannot be had. Neither compiles the venv: devstack.infra.warm
# writes the bytecode of what runs.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv && $(BIN)/python -m uv pip install --python $(BIN)/python --quiet \
		-e '.[dev]' || { $(BIN)/python -m pip install --quiet --upgrade pip && \
		$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'; }
	$(BIN)/python -m devstack.infra.warm
	@touch $(STAMP)

# Compile the project once before pytest, not once per worker and fleet process.
bytecode: setup
	$(BIN)/python -m compileall -q -j 0 tasks workers bridges ops devstack bench tests/kit

# ruff, then mypy over everything but the test modules ([tool.mypy] in pyproject.toml).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/python -m mypy

# `$(call typed,COMMAND)`: COMMAND with mypy beside it at the lowest priority, its report after
# COMMAND's; fails if either does. The suite leaves a core idle now and then (it waits on services),
# which is where a cold mypy (15 CPU-s) goes, instead of 15 s before the first test.
MYPY_OUT := $(VENV)/mypy.out
typed = nice -n 19 $(BIN)/python -m mypy > $(MYPY_OUT) 2>&1 & types=$$!; \
	$(1); tests=$$?; wait $$types; typed=$$?; cat $(MYPY_OUT); [ $$tests -eq 0 ] && [ $$typed -eq 0 ]

# The edit loop's tier: ruff, then every test that starts no fleet process and loads no model, with mypy.
check: setup bytecode
	$(BIN)/ruff check .
	@$(call typed,$(PYTEST) -m "not slow and not model" -n $(CHECK_WORKERS) --dist loadfile \
		--no-loadscope-reorder $(ARGS))

# Everything, as CI runs it (.ci/run): ruff, then the whole suite, with mypy.
test: setup bytecode
	$(BIN)/ruff check .
	@$(call typed,$(PYTEST) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS))

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
