# Quotient: the two commands a newcomer runs are `make demo` and `make test`.
# Every target creates .venv and installs what it needs; nothing is expected to be installed by hand.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ARGS ?=
PACKAGES := common agent scheduler quotient

.PHONY: all demo test lint format bench clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/quotient demo $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check $(PACKAGES) tests
	$(VENV)/bin/ruff format --check $(PACKAGES) tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff format $(PACKAGES) tests
	$(VENV)/bin/ruff check --fix $(PACKAGES) tests

# pytest exits 5 when it collected nothing: that would hide a broken suite, so it fails here.
test: lint
	@$(VENV)/bin/pytest $(ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose" >&2; exit 1; fi; exit $$rc

bench: $(STAMP)
	$(VENV)/bin/quotient bench all $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis build *.egg-info
