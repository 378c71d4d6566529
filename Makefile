# Two commands do all set-up on a fresh machine (Python >= 3.11 and Java 17 present):
#   make demo   - a full local crawl of the bundled demo site farm into $(ROOT)
#   make test   - the test suite (FAST=1 skips the tests marked slow: the crawls)
PYTHON ?= python3
VENV := .venv
ROOT ?= ./demo-crawl
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Every command here lets Python write its bytecode caches (an environment with PYTHONDONTWRITEBYTECODE set would
# otherwise compile each module again in each of the suite's many processes).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: demo test test-fast lint bench-frontier bench-fetchd bench-parse bench-cycle bench-freshness sim install clean

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "$(PYTHON) is older than 3.11, which this project needs (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# --no-compile: pip would byte-compile every file of every package (Airflow's alone are thousands) one by one, half
# of the install's time; Python compiles what is imported, once, on first import instead (below).
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --no-compile -e '.[all,dev,airflow]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/crawl demo --root $(ROOT)

# Two lanes (tests/conftest.py): the Spark tests in one xdist worker, the daemon and pure tests in the other. The
# tests marked packaging (wheel installs in clean virtualenvs) run after the suite, in .ci/check-wheel.
test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup --durations=25 -m '$(if $(FAST),not slow and ,)not packaging' $(PYTEST_ARGS)

test-fast:
	$(MAKE) test FAST=1

# On-demand frontier benchmark (not a test): synthetic 1 M and 10 M URL tables; prints figures.
bench-frontier: $(STAMP)
	$(PY) -m bench.frontier $(BENCH_ARGS)

# On-demand fetch daemon benchmark (not a test): loopback site farm; CPU vs raw aiohttp, delay-bound rate, RSS.
bench-fetchd: $(STAMP)
	$(PY) -m bench.fetchd $(BENCH_ARGS)

# On-demand parse benchmark (not a test): synthetic WARC segment; parse docs/s vs raw fastwarc + selectolax, dedup.
bench-parse: $(STAMP)
	$(PY) -m bench.parse $(BENCH_ARGS)

# On-demand batch-side benchmark (not a test): a real-HTML segment with exact and near copies over 1 M and 10 M known
# URLs; per step wall, whole-machine CPU, CPU ms/page, peak driver memory, Delta commits.
bench-cycle: $(STAMP)
	$(PY) -m bench.cycle $(BENCH_ARGS)

# On-demand freshness benchmark (not a test): `crawl run` and its fetch daemon against the loopback site farm (with
# hosts that list a new high-priority article every minute) for 15 minutes over a 1 M-URL frontier; prints one line
# of the two service levels judged from the farm's log and the tables. BENCH_ARGS="--minutes 3" for a smoke run.
bench-freshness: $(STAMP)
	$(PY) -m bench.freshness $(BENCH_ARGS)

# On-demand fleet simulation (not a test): the default run (10,000 hosts, 10 M URLs, 4 daemons, 24 simulated hours,
# with kills, freezes, SIGTERMs and a storage outage) on a virtual clock, in about 4 minutes; prints one line of
# figures judged from the simulated servers' log. SIM_ARGS changes it (e.g. --hosts 1000 --urls 100000 --hours 4;
# --report docs rewrites docs/simulation.md and its charts).
sim: $(STAMP)
	$(PY) -m bench.sim $(SIM_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) demo-crawl .pytest_cache
