# The two commands a newcomer needs (README.md): `make demo` and `make test`.
# Both create .venv when missing and (re)install the project when pyproject.toml changed.
PYTHON ?= python3
VENV   ?= .venv
OUT    ?= demo-out
STAMP  := $(VENV)/.installed
# The torch pin of pyproject.toml. TORCH_INDEX=<PyTorch's CPU wheel index> installs that version's
# CPU build (torch==X.Y.Z+cpu, which satisfies the pin) before the project, instead of the CUDA
# build that PyPI serves for Linux x86-64 (README.md, "Installing").
TORCH_PIN   := $(shell sed -n 's/.*"torch==\([0-9.]*\)".*/\1/p' pyproject.toml)
TORCH_INDEX ?=

# Debian packages the tests start servers from (tests/test_celery_cluster.py): installed when missing
# and this is root (CI); otherwise a message says what to install.
SERVICES := redis-server postgresql

.PHONY: demo test lint clean services

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH_INDEX),$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		--extra-index-url $(TORCH_INDEX) "torch==$(TORCH_PIN)+cpu")
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/seqenc demo --out $(OUT)

services:
	@if ! command -v redis-server >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SERVICES) >/dev/null; \
	  else echo "make test: install the Debian packages $(SERVICES) (the Celery cluster test needs them)" >&2; fi; \
	fi

test: $(STAMP) services
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(OUT) .pytest_cache .ruff_cache
