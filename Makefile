# The README's two commands: `make run` and `make test`; `make lint` is the lint and type gate CI runs first.
# `make run` needs only the scanner and the report: a light virtualenv ($(RUN_VENV), no torch, no CuPy).
# `make test` needs everything the tests exercise: the full one ($(VENV)).
VENV ?= .venv
RUN_VENV ?= .venv-run
PY := $(VENV)/bin/python
# Extra `sdcguard scan` options for `make run`, e.g. RUN_SCAN_ARGS="--budget 30" (after `--all`, so
# RUN_SCAN_ARGS="--only-idle" scans idle devices only, as the cron job does).
RUN_SCAN_ARGS ?= --budget 10

.PHONY: setup setup-run run test lint docs
setup: $(VENV)/.sdcguard-installed
setup-run: $(RUN_VENV)/.sdcguard-installed

$(VENV)/.sdcguard-installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $@

$(RUN_VENV)/.sdcguard-installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(RUN_VENV) --light
	touch $@

# The main job: scan this machine's devices into ./sdcguard.db, then print the per-device report.
# `--all` scans every device even where other work keeps it busy (this is a look at one machine, not the cron
# job, which scans idle devices only). The report prints what the scan found; make then fails with the scan's
# exit code (1 corruption). A scan that could not run (2) prints no report: the store would show an earlier run.
run: setup-run
	@echo "==> sdcguard scan --all $(RUN_SCAN_ARGS)   (every CPU core, or every GPU, for its budget in seconds)" >&2
	@$(RUN_VENV)/bin/sdcguard scan --all $(RUN_SCAN_ARGS); rc=$$?; \
	if [ $$rc -eq 2 ]; then echo "==> no report: the scan could not run (exit 2, the line above says why)" >&2; \
	else echo "==> sdcguard report" >&2; $(RUN_VENV)/bin/sdcguard report; fi; exit $$rc

test: setup
	$(PY) -m pytest

# ruff (lint and format check) over the whole tree, mypy over sdcguard/ and fleet_scan/ (settings in pyproject.toml). mypy keeps its cache in
# .mypy_cache, so a second run rechecks only what changed.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The documentation site (docs/, mkdocs.yml) into site/: warnings are errors (a broken link, a missing page or
# snippet, an API reference that no longer resolves). `$(VENV)/bin/mkdocs serve` shows it while you edit.
# NO_MKDOCS_2_WARNING: the theme prints a banner about its successor on every build; the pins hold this version.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
