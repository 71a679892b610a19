# The two commands a newcomer needs (README.md): `make demo` and `make test`.
# Both create .venv when missing and (re)install the project when pyproject.toml changed.
PYTHON ?= python3
VENV   ?= .venv
OUT    ?= demo-out
STAMP  := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/seqenc demo --out $(OUT)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(OUT) .pytest_cache .ruff_cache
