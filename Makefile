# The two commands of the README. Both create .venv from scratch when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench pipeline clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Set up and run the main job: the runnable example.
demo: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python examples/produce_acks_all.py

# Set up and run the tests: lint, types, then pytest.
test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,spark]'
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

bench: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks

# The data pipeline in one command (needs Java 17+): a seeded W1 trace, a 3x3 sweep (timeout x
# rate) replayed on local Spark, the summary table and pipeline-out/sweep.png.
pipeline: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[spark]'
	$(BIN)/python -m purgatory.pipeline sweep --out pipeline-out --overwrite

clean:
	rm -rf $(VENV) build pipeline-out *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
