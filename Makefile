# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONSTRAINTS := constraints-3.11.txt
DEMO_HOME := $(CURDIR)/.airflow-home

.PHONY: demo test fast lint docs docs-serve bench chaos standalone celery venv clean browser-deps screenshots

$(VENV)/.installed: setup.cfg pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip==26.3" || true
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[test,lint,docs]"
	@# The editable build leaves an egg-info here; on sys.path (tests run from here) it would
	@# declare every entry point a second time (Airflow then warns: plugin already registered).
	rm -rf airflow_resumable.egg-info
	touch $@

venv: $(VENV)/.installed

## The lesson's loan report as a real Airflow DAG on the embedded default (SQLite everywhere).
demo: venv
	@bash scripts/demo.sh

## The whole test suite; exits non-zero on any failure. The slow modules (a real Airflow each:
## scheduler, celery, browser) run as pytest processes of their own beside the rest (scripts/test.sh).
test: venv
	PY=$(PY) bash scripts/test.sh $(PYTEST_ARGS)

## The fast part: no real scheduler, no PostgreSQL server, no browser needed.
fast: venv
	$(PY) -m pytest -p no:cacheprovider -ra -m "not scheduler and not postgres and not browser" $(PYTEST_ARGS)

## Debian's chromium and chromedriver for the browser tests (installed only if missing).
browser-deps:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then echo "chromium: $$(/usr/bin/chromium --version 2>/dev/null)"; \
	else apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; fi

## The README's screenshots (docs/screenshots/): the browser test against a real airflow standalone.
screenshots: venv browser-deps
	RESUMABLE_SCREENSHOTS=$(CURDIR)/docs/screenshots $(PY) -m pytest -p no:cacheprovider -ra -s tests/test_browser.py

## Lint and type check: ruff over everything, mypy over the package.
lint: venv
	$(PY) -m ruff check airflow_resumable devtools tests bench dags scripts
	$(PY) -m mypy

## The docs site (docs/, mkdocs.yml) into build/site; strict: a warning (a broken link, a page
## missing from the navigation, a reference to code that does not exist) fails the build.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

## The docs site on http://127.0.0.1:8000, rebuilt on every change; Ctrl-C stops it.
docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --dev-addr 127.0.0.1:8000

## A local Airflow with the example DAGs (UI on :8080); Ctrl-C stops it.
standalone: venv
	@bash scripts/standalone.sh

## A CeleryExecutor deployment with two workers (Redis on 127.0.0.1:6379, PostgreSQL); Ctrl-C stops it.
celery: venv
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests $(PY) -m support.celery_cluster

## Chaos trials across network-namespace hosts (root, Redis, PostgreSQL): a table of faults and anomalies.
## make chaos TRIALS=100; make chaos SEED=123 replays one trial; MINUTES=60 stops starting new ones.
TRIALS ?= 100
chaos: venv
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests $(PY) -m support.chaos --trials $(TRIALS) $(if $(SEED),--seed $(SEED)) $(if $(MINUTES),--minutes $(MINUTES))

## Benchmarks: ratios measured side by side, each with its target.
bench: venv
	$(PY) -m bench

clean:
	rm -rf $(VENV) $(DEMO_HOME) .bench
