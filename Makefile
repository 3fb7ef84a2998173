# The two commands of the README. Both create .venv from scratch when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test quick docs lint bench pipeline clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Set up and run the main job: the runnable example.
demo: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[examples]'
	$(BIN)/python -m examples.minibroker demo

# Set up and run the tests: lint, types, then pytest once: the whole suite on the default build
# (the native core, which the install compiles: a build that fell back to the pure modules fails
# test_implementations.py), the core's test modules a second time on the pure-Python modules in
# the same run (tests/implementations.py; their ids end in [python]). About 10 minutes on a quiet
# 2-core machine.
test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,docs,examples,spark]'
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	PURGATORY_EXPECT_IMPLEMENTATION=native $(BIN)/python -m pytest

# The edit-test loop: the core's tests on the default build only, no lint (about a minute).
quick: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m pytest -q --core-only --implementation=native

# Build the documentation site into build/site (strict: any warning fails the build). pytest
# builds it too (tests/test_docs.py), so `make test` checks it.
docs: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict
	@echo "open build/site/index.html"

# Run the whole benchmark suite (about an hour; the spark extra and valgrind for the pipeline and
# instruction workloads) into one results file, then render its report and the W2 chart (also
# when a workload failed: the report names it, and make fails after).
bench: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[bench,spark]'
	$(BIN)/python -m benchmarks --output benchmarks/results.json; status=$$?; \
	$(BIN)/python -m benchmarks report benchmarks/results.json --markdown benchmarks/RESULTS.md \
		--plot benchmarks/w2.png && exit $$status

# The data pipeline in one command (needs Java 17+): a seeded W1 trace, a 3x3 sweep (timeout x
# rate) replayed on local Spark, the summary table and pipeline-out/sweep.png; then the load
# model: a cost profile of this machine (50 us of application work per request), and the rate
# raised past what one core serves (pipeline-load/load.png).
pipeline: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[spark]'
	$(BIN)/python -m purgatory.pipeline sweep --out pipeline-out --overwrite
	$(BIN)/python -m purgatory.pipeline calibrate --out pipeline-profile.json --application-cost 0.00005
	$(BIN)/python -m purgatory.pipeline sweep --out pipeline-load --overwrite --timeout-scale 1 \
		--rate-scale 1,4,8,16,32 --cost-profile pipeline-profile.json

clean:
	rm -rf $(VENV) build purgatory/_native.*.so pipeline-out pipeline-load pipeline-profile.json *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
