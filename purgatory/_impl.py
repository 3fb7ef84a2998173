"""Which implementation of the core runs: the native one, or the pure-Python reference.

The pure-Python modules are the core's specification and a complete implementation. Where the
package was built with its C extension (``purgatory._native``), the hot types get a C layout
and their hot methods a C body, as CPython's ``_asyncio`` does for ``asyncio.Future``: each
module defines its class over a *core* (the fields, in C or as ``__slots__``) and calls
`install` for the methods the extension implements; every other method is the Python one,
working on the same fields. An installed method keeps the Python function as its reference
(``__wrapped__``): its name, docstring and signature, and its body for every case the C body
leaves to it, so that one behaviour, one set of messages and one API come from one place.

``PURGATORY_NO_EXTENSIONS=1`` (the aio-libs' convention) selects the pure-Python modules alone;
`IMPLEMENTATION` says which one runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any, Final, Literal

__all__ = ("IMPLEMENTATION", "install", "native")

#: The native core's interface version these modules are written for (``NATIVE_API_VERSION`` in
#: ``purgatory/_csrc/native.h``).
API_VERSION: Final = 4


def _disabled() -> bool:
    return os.environ.get("PURGATORY_NO_EXTENSIONS", "") not in ("", "0")


def _load() -> Any:
    """The native core, or ``None`` where it was not built or is switched off."""
    if _disabled():
        return None
    name = f"{__package__}._native"
    if importlib.util.find_spec(name) is None:
        return None  # not built here (the install said why): the pure modules
    _native = importlib.import_module(name)  # built: a broken build is an error, not a fallback
    if _native.API_VERSION != API_VERSION:
        raise ImportError(
            f"purgatory._native was built from another version of the core (interface "
            f"{_native.API_VERSION}, these modules need {API_VERSION}): rebuild it "
            "(pip install --force-reinstall --no-deps ., or pip install -e . in a checkout), "
            "or set PURGATORY_NO_EXTENSIONS=1 to run the pure-Python modules"
        )
    return _native


#: The extension module, or ``None`` when the pure-Python modules run alone.
native: Final[Any] = _load()

IMPLEMENTATION: Final[Literal["native", "python"]] = "python" if native is None else "native"
"""Which implementation of the core runs: ``"native"`` (the C core the wheels carry) or
``"python"`` (the pure-Python modules: where the core could not be compiled, or with
``PURGATORY_NO_EXTENSIONS=1`` set before the import). Both behave the same; only speed differs."""


def install(cls: type, *names: str) -> None:
    """Give the methods `names` of `cls` their native body, if the native core runs."""
    if native is not None:
        native.install(cls, *names)
