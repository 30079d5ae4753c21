# Two entry points: `make demo` and `make test`. Both create .venv if missing and install into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU extras only: the cuda13 extra needs a GPU machine
EXTRAS ?= test,dask,plot,large,bench,pandas

.PHONY: demo test venv install install-test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

install: $(PY)
	$(PIP) install --quiet -e .

install-test: $(PY)
	$(PIP) install --quiet -e ".[$(EXTRAS)]"

demo: install
	$(VENV)/bin/tensorlogic demo

test: install-test
	$(VENV)/bin/ruff check tensorlogic tests benchmarks examples
	$(VENV)/bin/ruff format --check tensorlogic tests benchmarks examples
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: install-test
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
