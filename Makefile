# durable-sinks developer commands. On a fresh machine `make test` does all the set-up:
# virtualenv, package with dev extras, Java/Maven/PostgreSQL if missing, the servers, then
# ruff, mypy --strict and pytest. See README.md and docs/testbed.md.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Reinstall whenever pyproject.toml changes or a module is added or removed: the editable
# install is a tree of links to each file (editable_mode=strict, which mypy, pytest and
# import-linter follow), so a new module is importable only once it is reinstalled.
SOURCES := $(shell find src sinks coordinator manifest -name '*.py' 2>/dev/null | sort)
STAMP  := $(VENV)/.installed-$(shell (cat pyproject.toml tests/constraints.txt; echo $(SOURCES)) | sha256sum | cut -c1-16)

.PHONY: docs test test-unit test-compat test-fresh test-crash test-faults test-replicated test-slice test-repeat soak demo check lint typecheck pytest install \
        services-up services-down services-status services-reset bench

test: install
	@# In CI the servers are stopped afterwards, pass or fail (unless KEEP_SERVICES=1: .ci/run
	@# runs a slice of the long tiers next); on a workstation they stay up so the next run
	@# starts in seconds (`make services-down` stops them).
	@status=0; \
	$(PY) -m tests.services up && $(MAKE) --no-print-directory check || status=$$?; \
	if [ -n "$$CI" ] && [ -z "$(KEEP_SERVICES)" ]; then $(PY) -m tests.services down || status=1; fi; \
	exit $$status

check: lint typecheck pytest

# The inner loop: the tests that need no server (tests/unit), without the set-up of servers.
test-unit: install
	$(PY) -m pytest -n 2 tests/unit $(PYTEST_ARGS)

# The long tiers (tests/long_tiers.py; docs/testing.md, "Tiers"). Each is also dealt into CI's
# rotation: `.ci/run` runs `make test`, then one slice of them (below). Arguments after
# PYTEST_ARGS go to pytest.
TIER = $(PY) -m tests.long_tiers run

# The compatibility lanes (tests/compat_lanes.py, docs/testing.md): the Spark tests (driver and
# executor mode, SIGKILLed drivers, Spark Connect, the data source where pyspark has it, the
# install that keeps the user's pyspark) on Python 3.10 + pyspark 3.5.0 and Python 3.13 +
# pyspark 4.3.0, each in a virtualenv the test bed builds once. About 8 minutes; `make test`
# runs a smoke subset. COMPAT_ARGS="--lane oldest" for one lane.
test-compat: install
	$(PY) -m tests.services up postgres kafka s3 compat
	$(PY) -m tests.compat_lanes $(COMPAT_ARGS)

# A fresh machine's set-up reproduced here (tests/fresh_machine.py): a clone with no .venv, a
# temporary HOME (empty caches, empty Maven repository), the test bed on ports of its own, then
# the README's test command with a smoke subset of tests (FRESH_ARGS="--full --runs 3": the whole
# suite, three times from empty caches). Run it after any change to the test bed.
test-fresh: install
	$(PY) -m tests.fresh_machine $(FRESH_ARGS)

# The extended crash/replay run (docs/testing.md, Tiers): 2,000 generated examples per conformance
# scenario (every tests/integration/test_*_conformance.py: a new sink's is part of it by its
# name alone), 50 random SIGKILLs, 50 Spark driver kills per test and 50 runs of two queries
# sharing one writer. Several hours; not part of `make test`. Progress: pytest -v prints each
# test as it ends and the slowest at the end; each conformance scenario writes a line every
# 100 examples (count, minutes so far, an estimate of those left), shown as they come.
test-crash: install
	$(TIER) crash $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS))

# The fault matrix (docs/reliability.md): each fault (Postgres -m immediate / -m fast restarts
# of 30 s, pg_terminate_backend of the job's sessions, a Kafka broker SIGKILL and restart) at
# every protocol step of a batch and during recovery, in real Spark jobs on the faults bed.
# About 39 minutes (138 cases); `make test` runs one instance of each fault. Then the tests
# marked `fault_tier`: the test bed's Spark cluster with an executor and a worker killed, and
# the variants the default suite leaves to this tier (docs/testing.md).
test-faults: install
	$(TIER) faults $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS))

# The replicated servers' tier (docs/reliability.md, "Replicated servers"): a three-broker
# KRaft Kafka cluster and a Postgres primary with a streaming standby, started here on demand;
# Spark jobs with brokers killed at every protocol step, a rolling restart under load, and
# Postgres failed over to a synchronous and to an asynchronous standby (the tests marked
# `replicated_tier`, which the default suite deselects).
test-replicated: install
	$(TIER) replicated $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS))

# One slice of CI's rotation through the long tiers (docs/testing.md, "CI's rotation"): every
# test of test-faults, test-compat, test-replicated and a bounded test-crash sample is in one
# of 10 slices, dealt by measured time (tests/slices.json). N=k runs slice k; without N, CI's
# next slice (the one this machine's CI ran least recently), recorded as run.
# `$(PY) -m tests.long_tiers plan` lists them.
test-slice: install
	$(PY) -m tests.long_tiers $(if $(N),slice $(N),ci) $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS))

# One test (or several: T is any pytest selection) N times in a row beside a load of LOAD busy
# processes (default 1: a second worker's share of the 2 cores), to find a flaky test's cause
# (tests/repeat.py). Stops at nothing: prints each run's result and time, and exits non-zero
# if any run failed, with the failed runs' output kept.
test-repeat: install
	$(PY) -m tests.repeat --count $(or $(N),20) --load $(or $(LOAD),1) $(T) $(PYTEST_ARGS)

# The soak (docs/reliability.md, "Soak"): a streaming job on the test bed's Spark cluster
# into Postgres + Kafka + S3, a random fault every ~20 s (driver or executor killed, the faults
# Postgres or Kafka restarted, a link cut), restarted whenever it stops, then drained and
# audited; a verdict table, non-zero exit on any duplicate, loss or leftover. 30 minutes by
# default: `make soak SOAK_ARGS="--minutes 5"` for a short one, `--mode executor` for executor
# mode (Postgres + S3 + files), `--replicated` for Kafka on the three-broker cluster and
# Postgres on the primary + synchronous standby (leader, coordinator and controller kills, a
# rolling restart, Postgres restarts and failovers beside the job's own faults; the table
# gives each kind's pauses), `--own-servers 600` for servers of its own (every port + 600).
soak: install
	$(PY) -m tests.soak $(SOAK_ARGS)

# Orders from a Kafka topic through a Spark query into Postgres and Kafka; the driver is
# SIGKILLed part-way and restarted; prints what landed (0 duplicates, 0 lost) and exits 1
# otherwise. Sets up everything it needs, like `make test`.
demo: install
	$(PY) docs/demo.py $(DEMO_ARGS)

# Every benchmark in turn (benchmarks/run_all.py; docs/benchmarks.md), each drawing its ratio
# chart into docs/img/; a progress line before and after each ("[3/8] kafka_sink: done in
# 1m34s (2m47s since the start)") and a summary. An estimated 15 minutes; BENCH_ARGS="--quick"
# for the modest sizes the docs' charts come from (6 minutes without spark_end_to_end),
# "--only kafka_sink,postgres_sink" for some, "--list" for the commands.
bench: install
	$(PY) -m benchmarks.run_all $(BENCH_ARGS)

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: install
	$(PY) -m mypy

# The docs' generated reference tables (tests/support/docs_reference.py), rewritten from the
# code; tests/unit/test_docs_reference.py fails while one is stale.
docs: install
	$(PY) -m tests.support.docs_reference

# Two workers; the tests of one serial resource (the faults bed, the killable Connect server,
# the Spark cluster) run on one of them (tests/support/xdist_groups.py).
pytest: install
	$(PY) -m pytest -n 2 --dist loadgroup --durations=25 $(PYTEST_ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml tests/constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "durable-sinks needs Python 3.10 or newer: set PYTHON=python3.10 (or newer)")'
	rm -f $(VENV)/.installed-*
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]' --config-settings editable_mode=strict \
		-c tests/constraints.txt
	touch $@

services-up: install
	$(PY) -m tests.services up

services-down: install
	$(PY) -m tests.services down

services-status: install
	$(PY) -m tests.services status

services-reset: install
	$(PY) -m tests.services reset
