VENV ?= .venv
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-slow

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/molrl demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest

test-slow: $(STAMP)
	$(VENV)/bin/python -m pytest -m slow
