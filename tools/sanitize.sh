#!/usr/bin/env bash
# `make sanitize`: the native core built with AddressSanitizer, and tests run on it.
#
# Usage: tools/sanitize.sh PYTHON TEST...
#
# Why a build of its own: an ASAN-instrumented purgatory/_native*.so left in the tree would be
# what `make test` imports, and it aborts outside an ASAN process ("ASan runtime does not come
# first"). So the package is built out of the tree and installed into build/asan/lib (the pure
# modules beside the extension), and the tests import it from there: `python -P` keeps
# the working directory (and its uninstrumented build) off sys.path, and PYTHONPATH puts
# build/asan/lib first.
#
# Why these settings: the interpreter is not instrumented, so ASAN sees the heap only through
# malloc: PYTHONMALLOC=malloc sends every object there (pymalloc's arenas would hide a freed
# object's memory), and libasan is preloaded because it must be the first library loaded.
# detect_leaks=0: CPython leaks by design at exit (interned strings, static types), which says
# nothing about the core; reference leaks are `make leaks`'s job. halt_on_error=1: the first
# report ends the process. Every report also goes to a file (log_path): a report in a
# subprocess that a test started, and whose failure the test might not look at, fails the run
# too.
set -euo pipefail

python=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=build/asan
reports=$out/reports

libasan=$(gcc -print-file-name=libasan.so)
if [[ ! -e $libasan ]]; then
    echo "sanitize: gcc's libasan.so was not found (gcc -print-file-name=libasan.so: $libasan)" >&2
    exit 2
fi

echo "sanitize: building the native core with AddressSanitizer into $out/lib"
rm -rf "$out"
# pip builds in the tree, and setuptools reuses the objects and the module an earlier build left
# in build/ (`setup.py build_ext --inplace`'s, uninstrumented) when they are newer than the
# sources: gone, the core is compiled here with the flags below.
rm -rf build/temp.* build/lib.*
mkdir -p "$reports"
# pip builds from the project's own files (pyproject's build requirements, setup.py), outside
# the tree: a wheel, unpacked into $out/lib.
CFLAGS="-fsanitize=address -fno-omit-frame-pointer -O1 -g" LDFLAGS="-fsanitize=address" \
    PURGATORY_NO_EXTENSIONS= "$python" -m pip install --quiet --no-deps --no-cache-dir \
    --target "$out/lib" . >"$out/build.log" 2>&1 || {
    cat "$out/build.log" >&2
    exit 1
}
# ... and the instrumented objects it left there go too: a later in-place build would copy the
# ASAN module into purgatory/, whose import then aborts outside an ASAN process.
rm -rf build/temp.* build/lib.*
# setup.py falls back to the pure modules when compiling fails: here that is an error.
so=$(find "$out/lib/purgatory" -maxdepth 1 -name '_native*.so' | head -n 1)
if [[ -z $so ]] || ! nm -D "$so" | grep -q __asan_; then
    cat "$out/build.log" >&2
    echo "sanitize: no AddressSanitizer build of purgatory._native in $out/lib" >&2
    exit 1
fi

export PYTHONPATH="$root/$out/lib${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONMALLOC=malloc
export LD_PRELOAD="$libasan${LD_PRELOAD:+ $LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:log_path=$root/$reports/asan"
export PURGATORY_EXPECT_IMPLEMENTATION=native
# Python's fault handler off: AddressSanitizer reports a fault with its C stack, and a second
# handler of the same signal makes that report a "nested bug" without one.
export PYTHONFAULTHANDLER=
# The differential state machine writes each program there before each step: the program that
# crashed it, if one did (`python tests/test_differential_machine.py FILE` replays it).
journal=$root/$out/differential-machine-program.json
export PURGATORY_DIFFERENTIAL_JOURNAL=${PURGATORY_DIFFERENTIAL_JOURNAL:-$journal}
unset PURGATORY_NO_EXTENSIONS

# The tests must import the instrumented build, not the tree's.
imported=$("$python" -P -c 'import purgatory._native as n; print(n.__file__)')
if [[ $imported != "$root/$so" ]]; then
    echo "sanitize: the tests would import $imported, not $root/$so" >&2
    exit 1
fi

status=0
"$python" -P -m pytest -q -p no:cacheprovider "$@" || status=$?

shopt -s nullglob
found=("$reports"/asan.*)
if ((${#found[@]})); then
    for report in "${found[@]}"; do
        echo "sanitize: AddressSanitizer report $report:" >&2
        cat "$report" >&2
    done
    echo "sanitize: FAILED: ${#found[@]} AddressSanitizer report(s)" >&2
    if [[ -e $PURGATORY_DIFFERENTIAL_JOURNAL ]]; then
        echo "sanitize: the state machine's last program: $PURGATORY_DIFFERENTIAL_JOURNAL" >&2
    fi
    exit 1
fi
if ((status)); then
    echo "sanitize: FAILED: pytest exited with status $status" >&2
    exit "$status"
fi
echo "sanitize: passed, no AddressSanitizer report"
