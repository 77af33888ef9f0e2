# Entry points, all idempotent: `make up` (the fleet), `make test`, `make demo` (offline).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: up demo test test-fast lint install

$(STAMP): pyproject.toml Makefile
	# Redis for the integration tests and the local fleet: the system package.
	command -v redis-server >/dev/null || (apt-get update && apt-get install -y redis-server)
	# A C++ compiler for the CPU kernels (kernels/native), built on first use.
	command -v g++ >/dev/null || (apt-get update && apt-get install -y g++)
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch; an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[worker,triton,dev]"
	touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/genfleet up

demo: $(STAMP)
	$(VENV)/bin/genfleet generate "What is the capital of France?" --max-tokens 48

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/genfleet model fetch
	# Four test processes, each taking the next test as it frees (worksteal): much of an
	# integration test waits on a broker or a process. Types are checked beside them
	# (mypy takes a core for half a minute); either failing fails the run
	# (docs/testing.md, "Keeping it short").
	types=$$(mktemp); $(VENV)/bin/mypy > $$types 2>&1 & mypy=$$!; \
	$(PY) -m pytest -q -n 4 --dist worksteal; tests=$$?; \
	wait $$mypy; typed=$$?; cat $$types; rm -f $$types; \
	[ $$tests -eq 0 ] && [ $$typed -eq 0 ]

# The fast tier: every test that starts no broker, Redis or fleet process (about 2.5
# minutes on 2 cores; docs/testing.md). `make test` runs them all.
test-fast: $(STAMP)
	$(VENV)/bin/genfleet model fetch
	$(PY) -m pytest -q -n 2 -m "not integration"
