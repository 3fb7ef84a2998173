# The two commands of the README. Both create .venv from scratch when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test quick sanitize leaks fuzz fuzz-random docs lint bench pipeline clean

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
# the same run (tests/implementations.py; their ids end in [python]), one pytest worker per core
# (pytest-xdist; a module's tests stay on one worker), the longest modules dealt first
# (tests/scheduling.py: --no-loadscope-reorder keeps that order). About 10 minutes on a quiet
# 2-core machine.
test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,docs,examples,spark]'
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	PURGATORY_EXPECT_IMPLEMENTATION=native $(BIN)/python -m pytest -n auto --dist loadfile \
		--no-loadscope-reorder

# The edit-test loop: the core's tests on the default build only, no lint (about a minute).
quick: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m pytest -q --core-only --implementation=native

# The native core built with AddressSanitizer (out of the tree, in build/asan: the tree's own
# build is untouched) and SANITIZE_TESTS run on it under PYTHONMALLOC=malloc with gcc's libasan
# preloaded (tools/sanitize.sh says why each setting); any AddressSanitizer report, in the tests'
# process or in one they start (the differential test's workers), fails it. The core's tests on
# the native core (the pure world runs no C) but the Spark load model's (a JVM does not run with
# libasan preloaded) and the leak tests' (without pymalloc they have nothing to count: `make
# leaks` runs them), and the differential
# tests with their hostile programs, in worker processes and in one process (the state machine)
# (PURGATORY_DIFFERENTIAL_STEPS sets their length here too).
SANITIZE_TESTS ?= --core-only --implementation=native --ignore=tests/test_load_model.py \
	--ignore=tests/test_leaks.py tests tests/test_differential.py \
	tests/test_differential_machine.py
sanitize: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,examples,arrow]'
	tools/sanitize.sh $(BIN)/python $(SANITIZE_TESTS)

# The reference-leak tests (tests/test_leaks.py) on Debian's debug interpreter: tools/leaks.sh
# installs python3.11-dbg from apt when it is missing, makes build/dbg-venv with the `leaks`
# extra, and counts sys.gettotalrefcount() over each hot and error path. It builds the package
# from a copy (build/dbg-src), away from `make sanitize`'s build: .ci/run runs the two side by
# side (`make -j2 --output-sync=target sanitize leaks`).
leaks:
	tools/leaks.sh

# The differential test, long: STEPS actions per test (the suite's default keeps it under a
# minute), e.g. `make fuzz STEPS=1000000`. A crash or a difference prints the failing program.
STEPS ?= 100000
fuzz: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	PURGATORY_DIFFERENTIAL_STEPS=$(STEPS) $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_differential.py tests/test_differential_machine.py

# The same programs from a seeded random generator (tools/fuzz_differential.py): STEPS actions
# exactly, every failing program printed, crashes and differences counted apart.
SEED ?= 0
fuzz-random: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python tools/fuzz_differential.py $(STEPS) $(SEED)

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
