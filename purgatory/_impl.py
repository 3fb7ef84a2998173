"""Which implementation of the core runs: the native one, or the pure-Python reference.

The pure-Python modules are the core's specification and a complete implementation, and they
stay whole in every process, as CPython keeps ``asyncio.futures._PyFuture`` beside
``_asyncio.Future``: each core module defines its class over a pure *core* (its fields as
``__slots__``, named as the C core's type is: ``_OperationCore``, ...) under the public name and
keeps it as ``_Py<Name>``; nothing ever patches it. The pure classes build pure parts (class
attributes such as ``DelayedOperationPurgatory._Lists`` name them), so a pure purgatory never
calls C.

Where the package was built with its C extension (``purgatory._native``), the module then makes
the native class with `twin`: the same namespace (the very same functions, properties and
docstring) over the C core (the fields as a C layout), with a C body (a ``NativeMethod``) for
each of its hot methods, and binds the public name to it. So both implementations run in one
process (a test drives a pure purgatory beside a native one), and the reference is never a
patched class. A native method keeps its Python function as its reference (``__wrapped__``): its
name, docstring and signature, and its body for every case the C body leaves to it, so that one
behaviour, one set of messages and one API come from one place.

``PURGATORY_NO_EXTENSIONS=1`` (the aio-libs' convention) selects the pure-Python modules alone
(then the public names are the ``_Py`` classes themselves); `IMPLEMENTATION` says which one
runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import types
from typing import Any, Final, Literal

__all__ = ("IMPLEMENTATION", "native", "twin")

#: The native core's interface version these modules are written for (``NATIVE_API_VERSION`` in
#: ``purgatory/_csrc/native.h``).
API_VERSION: Final = 5


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


def twin(reference: type, core: type, *, hot: tuple[str, ...] = (), **overrides: Any) -> type:
    """The native class of the pure `reference`: its namespace over the C `core`.

    The class is made as the reference was (its metaclass, its bases: ``Generic[...]`` and
    ``ABC`` kept through ``__orig_bases__``), with the reference's pure core (its first base, the
    fields as ``__slots__``) replaced by `core`, and the reference's own namespace: the same
    function objects, properties, class attributes and docstring, ``__module__``,
    ``__qualname__`` and ``__final__``, and ``__slots__ = ()``. A name `core` defines itself (a
    field's descriptor, a C method of its own) is the core's. Each name of `hot` gets a
    ``NativeMethod``: the C body registered as ``"<reference name>.<name>"`` behind the
    reference's function. `overrides` replace or add class attributes (the native collaborators
    a method builds: the lists, the timer, a bucket class).

    A function that closes over ``__class__`` (a zero-argument ``super()``) is copied with a
    cell of its own that names the new class, so that ``super()`` resolves on it; every other
    function is shared. Anything else this does not know how to copy is refused (`TypeError`),
    rather than shared by accident.
    """
    pure_core = reference.__bases__[0]
    if "__slots__" not in pure_core.__dict__ or pure_core in vars(native).values():
        raise TypeError(f"{reference.__qualname__}'s first base {pure_core!r} is not a pure core")
    bases = tuple(
        core if base is pure_core else base
        for base in reference.__dict__.get("__orig_bases__", reference.__bases__)
    )
    cells: list[Any] = []
    namespace: dict[str, Any] = {}
    for name, value in reference.__dict__.items():  # (in its order: the dict's layout too)
        if name == "__slots__":
            namespace[name] = ()
        elif name not in _MADE_AGAIN and (name not in core.__dict__ or name in _THE_REFERENCES):
            if name == "__final__":  # (set once made, as `typing.final` did)
                continue
            namespace[name] = _copied(reference, name, value, cells)
    for name in hot:
        function = reference.__dict__.get(name)
        if not isinstance(function, types.FunctionType):
            raise TypeError(f"twin({reference.__qualname__}): {name} is not a function of its own")
        # (its fallback, the reference, runs on the native class: re-celled if it uses super())
        function = _recelled(function, cells)
        namespace[name] = native.function(function, f"{reference.__name__}.{name}")
    namespace.update(overrides)

    def body(ns: dict[str, Any]) -> None:
        ns.update(namespace)

    made = types.new_class(reference.__name__, bases, {"metaclass": type(reference)}, body)
    for cell in cells:
        cell.cell_contents = made
    if "__final__" in reference.__dict__:
        made.__final__ = reference.__final__  # type: ignore[attr-defined]
    return made


#: What ``type.__new__`` and the metaclasses make again for the new class, from its bases and
#: the namespace: not copied.
_MADE_AGAIN = frozenset(
    (
        "__dict__",
        "__weakref__",
        "__slots__",
        "__orig_bases__",
        "__parameters__",
        "__abstractmethods__",
        "_abc_impl",
    )
)
#: What names and documents the class: the reference's, though the core has its own.
_THE_REFERENCES = frozenset(("__doc__", "__module__", "__qualname__"))
#: Class attributes shared as they are: values, not code.
_VALUES = (type(None), bool, int, float, str, tuple, frozenset, dict, type)


def _copied(reference: type, name: str, value: Any, cells: list[Any]) -> Any:
    """`value`, the reference's `name`, for the native class's namespace (see `twin`)."""
    if isinstance(value, types.FunctionType):
        return _recelled(value, cells)
    if isinstance(value, staticmethod | classmethod):
        inner = value.__func__
        if isinstance(inner, types.FunctionType):
            return type(value)(_recelled(inner, cells))
    if isinstance(value, property):
        for part in (value.fget, value.fset, value.fdel):
            if part is not None and _class_cell(part) is not None:
                raise TypeError(f"{reference.__qualname__}.{name}: a property using super()")
        return value
    if isinstance(value, types.WrapperDescriptorType | types.MethodDescriptorType):
        return value  # (``__hash__ = object.__hash__``)
    if isinstance(value, _VALUES):
        return value
    raise TypeError(
        f"twin({reference.__qualname__}): cannot copy {name} = {value!r} to the native class"
    )


def _class_cell(function: Any) -> Any:
    """The ``__class__`` cell `function` closes over, or ``None``."""
    code = getattr(function, "__code__", None)
    if code is None or "__class__" not in code.co_freevars:
        return None
    return function.__closure__[code.co_freevars.index("__class__")]


def _recelled(function: types.FunctionType, cells: list[Any]) -> types.FunctionType:
    """`function` itself, or a copy whose ``__class__`` cell will name the native class."""
    if _class_cell(function) is None:
        return function
    cell = types.CellType()
    cells.append(cell)
    code = function.__code__
    closure = tuple(
        cell if free == "__class__" else old
        for free, old in zip(code.co_freevars, function.__closure__ or (), strict=True)
    )
    copy = types.FunctionType(
        code, function.__globals__, function.__name__, function.__defaults__, closure
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__ = function.__qualname__
    copy.__doc__ = function.__doc__
    copy.__annotations__ = dict(function.__annotations__)
    copy.__module__ = function.__module__
    copy.__dict__.update(function.__dict__)
    return copy
