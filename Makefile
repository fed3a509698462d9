# Two commands do all the set-up on a fresh machine:
#   make run    opens gradexplorer on its built-in demo
#   make test   runs the code checks (ruff, mypy, import-linter), then the whole
#               test suite (headless, in two processes); `make lint` runs the checks alone
#   make test-fast  the checks, then the tests not marked slow (docs/development.md, "Tiers")
#   make bench  also installs the optional `bench` extra (the peers: TorchLens, Captum),
#               then prints the benchmark table
# Both create or refresh the virtual environment in .venv first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint bench venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch and torchvision first, pinned to the releases this machine holds on disk;
	# elsewhere pip takes any release that the ranges in pyproject.toml allow.
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1" || $(BIN)/python -m pip install -q "torch>=2.4" "torchvision>=0.19"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/gradexplorer

lint: $(STAMP)
	$(BIN)/python scripts/check_code.py

# pytest-xdist: the tests of one file run in one process (their module fixtures are built
# once), files are dealt out to PYTEST_WORKERS processes; PYTEST_WORKERS=0 runs in this one.
# A worker that crashes ends the run at once, naming the test it ran: under --dist loadfile
# a replaced worker can wait for work that never comes, and the run hangs until killed.
PYTEST_WORKERS ?= 2
PYTEST := QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile \
	--max-worker-restart=0 --durations=20

test: lint
	$(PYTEST) $(PYTEST_ARGS)

test-fast: lint
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

BENCH_STAMP := $(VENV)/.installed-bench

# The peers measured beside gradexplorer (TorchLens, Captum): the optional `bench` extra.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q -e ".[test,bench]"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .import_linter_cache
