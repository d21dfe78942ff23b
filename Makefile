# The README's two commands: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup run test
setup: $(VENV)/.sdcguard-installed

$(VENV)/.sdcguard-installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $@

# The main job: scan this machine's devices into ./sdcguard.db, then print the per-device report.
run: setup
	$(VENV)/bin/sdcguard report

test: setup
	$(PY) -m pytest
