# The README's two commands: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup run test
setup: $(VENV)/.sdcguard-installed

$(VENV)/.sdcguard-installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $@

# The main job: scan this machine's devices into ./sdcguard.db, then print the per-device report.
# The report prints whatever the scan found; make then fails with the scan's exit code (1 corruption, 2 could not run).
run: setup
	$(VENV)/bin/sdcguard scan --budget 10; rc=$$?; $(VENV)/bin/sdcguard report; exit $$rc

test: setup
	$(PY) -m pytest
