"""What a release builds (pyproject.toml's [tool.cibuildwheel], .github/workflows/release.yml):
the wheels users get, read the way cibuildwheel reads its selectors (shell-style patterns over
build identifiers such as ``cp314-manylinux_aarch64``), without running it."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CIBUILDWHEEL = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
WORKFLOW = (ROOT / ".github" / "workflows" / "release.yml").read_text()


def built(identifier: str) -> bool:
    """Whether cibuildwheel, given the project's build and skip patterns, builds it."""
    return any(fnmatch(identifier, p) for p in CIBUILDWHEEL["build"]) and not any(
        fnmatch(identifier, p) for p in CIBUILDWHEEL["skip"]
    )


def test_the_native_wheels_cover_cpython_3_11_to_3_15_on_both_linux_libcs_and_arches() -> None:
    for version in ("311", "312", "313", "314", "315"):
        for platform in (
            "manylinux_x86_64",
            "manylinux_aarch64",
            "musllinux_x86_64",
            "musllinux_aarch64",
            "macosx_x86_64",
            "macosx_arm64",
            "win_amd64",
        ):
            assert built(f"cp{version}-{platform}"), (version, platform)
    assert not built("cp310-manylinux_x86_64")  # (not supported: requires-python >= 3.11)


def test_free_threaded_and_32_bit_builds_are_left_out_on_purpose() -> None:
    for identifier in ("cp313t-manylinux_x86_64", "cp314t-macosx_arm64", "cp315t-win_amd64"):
        assert not built(identifier), identifier
    for identifier in ("cp314-manylinux_i686", "cp314-musllinux_i686", "cp314-win32"):
        assert not built(identifier), identifier
    text = (ROOT / "pyproject.toml").read_text()
    assert "Free-threaded CPython" in text.split('"cp3??t-*"')[0].rsplit("skip = [", 1)[1]


def test_the_workflow_pins_cibuildwheel_and_builds_the_pure_wheel_too() -> None:
    pinned = re.findall(r"uses: pypa/cibuildwheel@(\S+)", WORKFLOW)
    assert len(pinned) == 1
    assert re.fullmatch(r"v\d+\.\d+\.\d+", pinned[0]), pinned  # an exact release
    # 4.3.5, checked with --print-build-identifiers: CPython 3.15 is one of its regular targets.
    assert tuple(map(int, pinned[0][1:].split("."))) >= (4, 3, 5)
    assert "ubuntu-24.04-arm" in WORKFLOW  # Linux aarch64
    assert 'PURGATORY_NO_EXTENSIONS: "1"' in WORKFLOW
    assert "-py3-none-any.whl" in WORKFLOW
    assert "needs: [sdist, wheels, pure-wheel]" in WORKFLOW
