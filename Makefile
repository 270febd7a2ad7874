VENV ?= .venv
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-slow

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/molrl demo

# one test process per core (pytest-xdist): every test runs on one torch thread, so one process leaves cores idle
test: $(STAMP)
	$(VENV)/bin/python -m pytest -n auto --dist worksteal

test-slow: $(STAMP)
	$(VENV)/bin/python -m pytest -m slow
