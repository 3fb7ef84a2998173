# The two commands of the README. Both create .venv from scratch when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test docs lint bench pipeline clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Set up and run the main job: the runnable example.
demo: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[examples]'
	$(BIN)/python -m examples.minibroker demo

# Set up and run the tests: lint, types, then pytest.
test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,docs,examples,spark]'
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

# Build the documentation site into build/site (strict: any warning fails the build). pytest
# builds it too (tests/test_docs.py), so `make test` checks it.
docs: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict
	@echo "open build/site/index.html"

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
