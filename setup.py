"""The native core's build: everything else about the project is in pyproject.toml.

`purgatory._native` is compiled from purgatory/_csrc/ (one translation unit, native.c). It is
optional, as the aio-libs' accelerators are: where it cannot be compiled (no compiler, an
interpreter it does not support), the build says so in one line and installs the pure-Python
modules, which are the reference and a complete implementation on their own; where
``PURGATORY_NO_EXTENSIONS`` is set, it is not even tried. ``purgatory.IMPLEMENTATION`` tells
which one an installation runs.
"""

from __future__ import annotations

import os
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_HERE = os.path.dirname(os.path.abspath(__file__))


def _disabled() -> bool:
    return os.environ.get("PURGATORY_NO_EXTENSIONS", "") not in ("", "0")


class OptionalBuildExt(build_ext):
    """build_ext that installs the pure-Python modules, with a notice, when compiling fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure to build: the pure modules install
            self._failed(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - as above
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        # A module an earlier build left in the tree (an editable install's) would otherwise be
        # imported as if this build had succeeded.
        for ext in self.extensions:
            stale = os.path.join(_HERE, *ext.name.split(".")) + sysconfig.get_config_var(
                "EXT_SUFFIX"
            )
            if os.path.exists(stale):
                os.remove(stale)
        self._notice(exc)

    @staticmethod
    def _notice(exc: Exception) -> None:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(
            f"purgatory: the native core was not built ({reason}); the pure-Python modules are "
            "installed (purgatory.IMPLEMENTATION == 'python')",
            file=sys.stderr,
        )


# The C side computes deadlines with the same IEEE operations as the reference, in the same
# order: no fused multiply-add may change a rounding.
_FLAGS = [] if sys.platform == "win32" else ["-ffp-contract=off", "-fno-strict-aliasing"]

setup(
    ext_modules=[]
    if _disabled()
    else [
        Extension(
            "purgatory._native",
            sources=["purgatory/_csrc/native.c"],
            depends=[
                os.path.join("purgatory", "_csrc", name)
                for name in (
                    "native.h",
                    "method.c",
                    "operation.c",
                    "wheel.c",
                    "timer.c",
                    "thresholds.c",
                    "watchers.c",
                    "purge_rule.c",
                    "purgatory.c",
                )
            ],
            extra_compile_args=_FLAGS,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
