# The two commands of README.md: `make demo` and `make test`. Both install what they need
# into .venv and tools/ first; what they expect on the machine is README's list ("The two commands").
PYTHON ?= python3
VENV ?= .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(BIN):$(PATH)

.PHONY: install agents browser samples demo lint test test-fast migrate web worker beat clean announce-test announce-test-fast

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## make agents: the pinned agent CLIs (claude, codex, gemini, pi) in tools/agents (project-local npm install).
agents:
	bash scripts/install-agent-clis.sh

## make browser: Debian's Chromium for the browser tests (apt-get; Playwright drives /usr/bin/chromium).
browser:
	bash scripts/install-chromium.sh

## make samples: the pinned sdists and npm packages of real libraries the tests run pipelines on (tools/repos/),
## and the packages their tests install, for the loopback registry (tools/registry/).
samples: install
	bash scripts/fetch-sample-repos.sh

## make demo: a real two-stage pipeline on a real repository through a separate Celery worker.
demo: install agents
	$(BIN)/python manage.py migrate -v 0
	$(BIN)/python manage.py demo

## make test: the whole suite (slow end-to-end tests included), in TEST_WORKERS pytest-xdist workers
## (default 2, as CI's jobs run it; 0: in this process), each taking the next test when it is free, the longest
## first (tests/conftest.py): 17.5 min from a fresh clone on this machine kind. Three workers were no faster
## here (measured twice): the end-to-end tests' agent CLIs fill both cores in the first half.
TEST_WORKERS ?= 2
test: announce-test install agents browser samples
	$(BIN)/python scripts/timed.py $(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --maxschedchunk 2

## make lint: ruff, with pyproject.toml's rules and complexity limit (tests/test_lint.py runs it in both tiers).
lint: install
	$(BIN)/ruff check .

## make test-fast: the inner loop: no worker process and no whole run driven (tests/conftest.py marks those),
## in two pytest-xdist workers, with its wall and CPU time printed (scripts/timed.py).
## It needs the agent CLIs too: the sandbox's bubblewrap is the one the pinned codex package ships.
test-fast: announce-test-fast install agents
	$(BIN)/python scripts/timed.py $(BIN)/python -m pytest -q -n 2 -m "not slow and not pipeline"

announce-test:
	@echo "make test installs first, each step a no-op once done: the venv .venv (pyproject.toml, [test] extras);"
	@echo "  the pinned agent CLIs in tools/agents (npm; the sandbox's bubblewrap comes with codex);"
	@echo "  Debian's $$(sed 's/#.*//' scripts/debian-packages.txt | xargs) (apt-get, root or sudo; the browser tests skip without);"
	@echo "  the sample sdists in tools/repos (PyPI). Then it runs the whole suite."

announce-test-fast:
	@echo "make test-fast installs first, each step a no-op once done: the venv .venv (pyproject.toml, [test] extras)"
	@echo "  and the pinned agent CLIs in tools/agents (npm; the sandbox's bubblewrap comes with codex)."
	@echo "  Then the fast tier in two pytest-xdist workers, and its wall and CPU time."

migrate: install
	$(BIN)/python manage.py migrate

# --insecure: runserver serves the admin's static files even with DJANGO_DEBUG off (a local tool). It listens
# on CP_WEB_ADDRESS (README.md's settings table), the address the sandbox refuses to agents and gates.
CP_WEB_ADDRESS ?= 127.0.0.1:8000
web: migrate
	$(BIN)/python manage.py runserver --insecure $(CP_WEB_ADDRESS)

# the flags are engine/processes/worker_process.py WORKER_FLAGS (the tests' workers use the same; a test
# checks): the engine needs no gossip, mingle or worker event heartbeat. Run it under a process
# supervisor (systemd with KillMode=mixed, docker's restart policy): reconciliation resumes what a dead
# worker left. Its node name is CP_HOST_NAME@machine, so two hosts' workers on one machine differ.
worker: migrate
	$(BIN)/celery -A controlpanel worker -l info -Q "$${CP_QUEUE:-runs}" -n "$${CP_HOST_NAME:-celery}@%h" --without-gossip --without-mingle --without-heartbeat

beat: migrate
	$(BIN)/celery -A controlpanel beat -l info --schedule "$${CP_VAR_DIR:-var}/celerybeat-schedule"

clean:
	rm -rf var/test
