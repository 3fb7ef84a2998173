"""Prints, as JSON, what a user reads of the public API: every public callable's signature and
docstring, and `help()`'s text of the public classes. test_implementations.py compares what
the native core and the pure-Python modules print.

Run: ``python tests/api_surface.py`` (``PURGATORY_NO_EXTENSIONS=1`` for the pure modules).
"""

from __future__ import annotations

import inspect
import json
import pydoc
import re
from typing import Any

import purgatory
import purgatory.asgi
import purgatory.testing

MODULES = (purgatory, purgatory.testing, purgatory.asgi)


def describe(obj: Any) -> Any:
    try:
        signature: str | None = str(inspect.signature(obj))
    except (TypeError, ValueError):
        signature = None
    return [signature, inspect.getdoc(obj)]


def surface() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for module in MODULES:
        for name in module.__all__:
            obj = getattr(module, name)
            qualified = f"{module.__name__}.{name}"
            if isinstance(obj, type):
                found[qualified] = describe(obj)
                for attribute in dir(obj):
                    if attribute.startswith("_") and attribute not in ("__init__", "__await__"):
                        continue
                    member = inspect.getattr_static(obj, attribute)
                    value = getattr(obj, attribute)
                    kind = type(member).__name__ if not callable(value) else "callable"
                    found[f"{qualified}.{attribute}"] = [kind, *describe(value)]
                # help() of the class, without the addresses some reprs carry
                text = pydoc.render_doc(obj, renderer=pydoc.plaintext)  # type: ignore[attr-defined]
                found[f"help({qualified})"] = re.sub(r" at 0x[0-9a-f]+", "", text)
            elif callable(obj):
                found[qualified] = describe(obj)
    return found


if __name__ == "__main__":
    print(json.dumps({"implementation": purgatory.IMPLEMENTATION, "surface": surface()}))
