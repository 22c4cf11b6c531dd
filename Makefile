# Switchyard: `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=
# pytest-xdist workers. Most tests wait on a service or a fleet process, so more workers than the
# 2 cores of the reference box pay off; measured in README "Tests" (make test: with 4 the two cores
# were idle 17 % of the run; with 6 the suite's CPU did not grow, about 6 CPU-s per extra worker for its
# collection and session services, and the six workers' last modules ended within 10 s of each other;
# eight gave the same wall time for 26 CPU-s more).
# make check stays at 4: its tests mostly wait, and it is done in a minute. Tests are handed out by module
# (--dist loadfile): a module-scoped stack starts on one worker only. (--dist loadgroup with the
# modules' xdist_group marks did not: pytest 9.2 made an item's nodeid read-only, xdist 3.8 still
# appends the group to it, and every group was silently spread over all workers.) Modules go out in
# collection order (--no-loadscope-reorder; tests/conftest.py puts the slow ones first), not
# largest-first by test count, which left a two-test, one-minute module like test_sentinel for last.
TEST_WORKERS  ?= 6
CHECK_WORKERS ?= 4
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider
# Python caches compiled modules (and pytest its assert-rewritten test modules) in __pycache__/
# unless PYTHONDONTWRITEBYTECODE is set, as it is on the reference box. Unset, every pytest-xdist
# worker rewrote all test modules (~5 s of CPU each) and every fleet process a test starts (a few
# hundred in `make test`) compiled the project's modules again. An empty value means unset.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup bytecode lint check test demo bench proto clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# The project's modules compiled once, in parallel, before the tests. A fresh clone has no __pycache__:
# otherwise every xdist worker, and each fleet process a test starts before one has written them,
# compiles them again. pip compiled the installed packages already. Its gain is within the noise
# (make check from fresh clones: 58.3 s without, 56.3 and 58.3 s with; 48.1 s in a tree already run):
# most of a fresh clone's extra time is pytest rewriting the test modules' asserts in each worker.
bytecode: setup
	$(BIN)/python -m compileall -q -j 0 tasks workers bridges ops deploy bench tests/kit

lint: setup
	$(BIN)/ruff check .

# The edit loop's tier: lint, then every test that starts no fleet process and loads no model.
check: lint bytecode
	$(PYTEST) -m "not slow and not model" -n $(CHECK_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

# Everything, as CI runs it (.ci/run): lint, then the whole suite.
test: lint bytecode
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

demo: setup
	$(BIN)/python -m deploy.demo $(ARGS)

bench: setup
	$(BIN)/python -m bench $(ARGS)

proto: setup
	$(BIN)/python -m workers.cairn.proto_build

clean:
	rm -rf $(VENV) .pytest_cache
