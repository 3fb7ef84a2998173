#!/usr/bin/env bash
# `make leaks`: the reference-leak tests (tests/test_leaks.py) on Debian's debug interpreter.
#
# Usage: tools/leaks.sh [PYTEST ARGUMENT...]
#
# Why a debug interpreter: its sys.gettotalrefcount() counts every reference the process holds,
# so a native core that forgets one Py_DECREF in a rare path shows as growth of one per
# iteration, where a release build can only count allocated blocks. Its Py_DEBUG checks
# (reference counts going negative, objects used after dealloc, a callback returning a result
# with an exception set) fail loudly on what a release build lets pass.
#
# Set-up, from a fresh Debian (bookworm) machine: the debug interpreter, its headers and venv
# from apt (only when missing), a virtualenv of its own (build/dbg-venv) with the `leaks`
# extra of pyproject.toml, and the package installed there with the native core compiled for
# that interpreter (its extension has its own ABI suffix, `cpython-311d`). The tests run with
# `python -P`, so that the checkout's own build is not on sys.path.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=python3.11-dbg
venv=build/dbg-venv

# Whether apt can install each of the packages (a fresh machine may not have read its lists).
candidates() {
    local package
    for package in "$@"; do
        if [[ -z $(apt-cache policy "$package") ]] ||
            apt-cache policy "$package" | grep -q 'Candidate: (none)'; then
            return 1
        fi
    done
}

if ! command -v "$py" >/dev/null; then
    packages=(python3.11-dbg python3.11-dev python3.11-venv)
    sudo=()
    if ((EUID != 0)); then sudo=(sudo); fi
    if ! candidates "${packages[@]}"; then
        "${sudo[@]}" apt-get update -q
    fi
    if ! candidates "${packages[@]}"; then
        echo "leaks: apt has no candidate for one of ${packages[*]} (apt-cache policy)" >&2
        exit 2
    fi
    echo "leaks: installing ${packages[*]}"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}"
fi

if [[ ! -x $venv/bin/python ]]; then
    "$py" -m venv "$venv"
fi
# pip's own output (the debug interpreter shows its ResourceWarnings) only when it fails.
log=build/dbg-venv/pip.log
pip=(env PYTHONWARNINGS=ignore "$venv/bin/python" -m pip install --quiet
    --disable-pip-version-check)
# The package is built from a copy of what its build reads (build/dbg-src), not in the tree:
# pip builds a local directory in place, and its build/ and egg-info there are those of `make
# sanitize`'s build (which also deletes build/lib.* and build/temp.*): so copied, `.ci/run`
# runs the two side by side. (No compiled module is copied: the debug build compiles its own.)
src=build/dbg-src
rm -rf "$src"
mkdir -p "$src"
tar -c --exclude=__pycache__ --exclude='*.so' --exclude='*.o' \
    pyproject.toml setup.py README.md LICENSE purgatory | tar -x -C "$src"
# The package itself anew every run (its version does not change with the sources).
if ! { "${pip[@]}" "./$src[leaks]" && "${pip[@]}" --no-deps --force-reinstall "./$src"; } \
    >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
fi

"$venv/bin/python" -P -c '
import sys, purgatory, purgatory._native as n
assert hasattr(sys, "gettotalrefcount"), "not a debug interpreter"
assert purgatory.IMPLEMENTATION == "native", purgatory.IMPLEMENTATION
print(f"leaks: {sys.executable} (debug build), {n.__file__}")
'
PURGATORY_EXPECT_IMPLEMENTATION=native "$venv/bin/python" -P -m pytest -q -p no:cacheprovider \
    tests/test_leaks.py "$@"
