"""The native core as a module (PEP 489 multi-phase init, PEP 630 heap types, a module state).

Each module object has its own state and its own types; a C body reads the state of the module
that made its method, and runs only once that module has pulled the reference's helpers from its
own package (the facade no longer pushes them). These hold on the native build only: the
``[python]`` copy of this module has no extension to look at.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import inspect
import re
import weakref
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import purgatory
from purgatory import DelayedOperation
from purgatory._impl import native
from purgatory._wheel import Bucket, TimingWheel

pytestmark = pytest.mark.skipif(
    purgatory.IMPLEMENTATION != "native", reason="the native core's module: not in the pure build"
)

CSRC = Path(__file__).resolve().parents[1] / "purgatory" / "_csrc"  # the checkout's sources
HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE
CORES = (
    "OperationCore",
    "BucketCore",
    "WheelCore",
    "TimerCore",
    "ThresholdCore",
    "ListsCore",
    "RuleCore",
    "PurgatoryCore",
    "NativeMethod",
)


def a_second_instance() -> ModuleType:
    """A second module object of the same extension, as a sub-interpreter's import makes one
    (a multi-phase module is not cached per process: each spec's exec makes a fresh state)."""
    spec = importlib.util.find_spec("purgatory._native")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_types_are_heap_types_immutable_as_the_static_ones_were() -> None:
    for name in CORES:
        core = getattr(native, name)
        assert core.__flags__ & HEAPTYPE, name
        with pytest.raises(TypeError):
            core.anything = 1  # as on a static type
    assert native.OperationCore.__module__ == "purgatory._operation"
    assert "__new__" not in vars(native.OperationCore)
    with pytest.raises(TypeError):
        native.NativeMethod()  # only `function` makes one


def test_the_facade_pushes_nothing_into_the_core() -> None:
    """The helpers are pulled by the C (`native_pull_helpers`); `bind` is gone."""
    assert not hasattr(native, "bind")


def test_each_module_object_has_its_own_types_and_state() -> None:
    other = a_second_instance()
    for name in CORES:
        assert getattr(other, name) is not getattr(native, name), name
    assert not issubclass(DelayedOperation, other.OperationCore)


def test_a_c_body_runs_only_for_the_packages_own_module() -> None:
    """The package's module pulled its helpers at its first C call and runs its C bodies; a
    second instance, which is not the package's ``_impl.native``, never pulls and always runs the
    reference (and so never mixes another module's types or helpers into its state)."""
    calls: list[Any] = []

    def reference(due: list[Any], now: Any, outcome: str = "expired", **kw: Any) -> int:
        calls.append(due)
        return -1

    ours = native.function(reference, "_operation.expire_due")
    assert ours([], 0, purge_queue=[], ended=None) == 0  # the C body: nothing due, none expired
    assert calls == []
    theirs = a_second_instance().function(reference, "_operation.expire_due")
    assert theirs([], 0, purge_queue=[], ended=None) == -1
    assert len(calls) == 1


class _Watcher:
    """A threshold watcher that is not an operation: its state and marks read as attributes."""

    __slots__ = ("_marks", "_state")

    def __init__(self, threshold: int) -> None:
        self._marks = threshold
        self._state = 0


class _Lists:
    """What `release` calls on the lists for a watcher already finished (none here)."""

    def left(self, op: Any) -> None:
        raise AssertionError("no watcher finished")


def test_the_threshold_types_methods_read_the_state_of_the_class_that_defines_them() -> None:
    """`ThresholdCore`'s own methods are no NativeMethod: `release` and `pop` reach the module
    state through their defining class (PEP 573), whatever subclass `self` is of. A second
    instance's type, whose state never pulled the reference's helpers, works on its own (the
    `threshold_of` of a watcher that is not an operation is then imported by name)."""
    other = a_second_instance()

    class Watchers(other.ThresholdCore):  # type: ignore[misc,name-defined]
        __slots__ = ()

    watchers = Watchers({})
    members = [_Watcher(threshold) for threshold in (3, 1, 2)]
    for member in members:
        assert watchers.add(member, member._marks)
    assert watchers.pop(members[0], default="missing", key="k") is None
    assert watchers.pop(members[0], "missing", "k") == "missing"
    watchers.release(5, _Lists())
    assert list(watchers.plain) == [members[1], members[2]]  # in threshold order
    assert (watchers.at, list(watchers.run), watchers.heap) == ({}, [], [])


def test_the_wheels_queue_setter_checks_buckets_of_its_own_module() -> None:
    """The `_heap` setter runs outside any C body: it finds its module's state through the type's
    MRO (a subclass's, here a second instance's), so a bucket of another module's type is
    refused as anything else that is not a bucket is."""
    other = a_second_instance()

    class Wheel(other.WheelCore):  # type: ignore[misc,name-defined]
        __slots__ = ()

    wheel = Wheel()
    ours = other.BucketCore()
    wheel._heap = [(0, 0, 0, ours)]
    assert wheel._heap == [(0, 0, 0, ours)]
    with pytest.raises(TypeError):
        wheel._heap = [(0, 0, 0, native.BucketCore())]
    assert wheel._heap == [(0, 0, 0, ours)]  # unchanged


def test_a_dropped_module_object_is_collected_with_its_types() -> None:
    """The module's traverse and clear cover its state: the cycle module -> state -> types ->
    module (each heap type keeps its module) is collected once nothing else holds it."""
    other = a_second_instance()
    core = weakref.ref(other.OperationCore)
    dropped = weakref.ref(other)
    del other
    gc.collect()
    assert dropped() is None
    assert core() is None


def test_the_c_has_no_static_type_and_no_private_api() -> None:
    """Heap types only, and CPython's public API only (a private name such as ``_PyDict_Pop`` may
    change or go in any release): what a sub-interpreter or a free-threaded build needs first."""
    sources = sorted(CSRC.glob("*.[ch]"))
    assert sources
    for source in sources:
        text = source.read_text()
        assert not re.findall(r"static\s+PyTypeObject\s+\w+\s*=", text), source.name
        assert not re.findall(r"\b_Py\w+", text), source.name


# -- the lifecycle generated from the field tables ------------------------------------------------

#: The cores whose traverse / clear / dealloc are still written by hand (none now: every struct is
#: checked against its table); a core added by hand would be listed here until it gets one.
LIFECYCLE_BY_HAND: set[str] = set()

#: Pointers in a struct that are no owned reference (the weak references' list).
NOT_OWNED = {"weakreflist"}


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)


def _sources() -> str:
    return "\n".join(_strip_comments(path.read_text()) for path in sorted(CSRC.glob("*.[ch]")))


def _object_members(source: str, struct: str) -> set[str]:
    """The `PyObject *` members (not `PyObject **`, an array) of `typedef struct {...} struct;`."""
    match = re.search(r"typedef struct \{([^{}]*)\}\s*" + struct + r";", source)
    assert match is not None, struct
    names: set[str] = set()
    for declaration in re.findall(r"PyObject\s*(\*[^;]*);", match.group(1)):
        for declarator in (d.strip() for d in declaration.split(",")):
            if not declarator.startswith("**"):
                names.add(declarator.lstrip("*").strip())
    return names


def _table(source: str, name: str) -> set[str]:
    """The members an X-macro table `#define NAME(X) X(a) X(b) ...` lists."""
    if name == "NO_FIELDS":
        return set()
    match = re.search(r"#define " + name + r"\(X\)((?:[^\n]*\\\n)*[^\n]*)", source)
    assert match is not None, name
    return set(re.findall(r"X\((\w+)\)", match.group(1)))


def _lifecycles(source: str) -> dict[str, tuple[str, str, str]]:
    """Each TYPE_LIFECYCLE(prefix, Type, FIELDS, KEPT, ...): prefix -> (Type, FIELDS, KEPT)."""
    found = re.findall(r"^TYPE_LIFECYCLE\((\w+),\s*(\w+),\s*(\w+),\s*(\w+),", source, re.M)
    return {prefix: (struct, fields, kept) for prefix, struct, fields, kept in found}


def test_every_object_field_of_a_core_struct_is_in_its_field_table() -> None:
    """A `PyObject *` added to a struct and not to its table would be neither visited, cleared
    nor released (a leak, or a cycle never broken): each struct's object members are its
    table's (FIELDS and KEPT), and each core type has a generated lifecycle."""
    source = _sources()
    lifecycles = _lifecycles(source)
    specs = set(
        re.findall(r"^CORE_SPEC\(\s*\w+,\s*\"[^\"]*\",\s*\"[^\"]*\",\s*\w+,\s*(\w+)", source, re.M)
    )
    assert len(specs) == 8
    assert set(lifecycles) == (specs | {"nm"}) - LIFECYCLE_BY_HAND
    for prefix, (struct, fields, kept) in lifecycles.items():
        table = _table(source, fields)
        held = _table(source, kept)
        assert not table & held, prefix
        assert _object_members(source, struct) - NOT_OWNED == table | held, prefix


class _Fresh:
    """An object no one else holds (weakly referenced: when it is released is seen)."""


@functools.cache
def _subclass(core: type) -> type:
    """A Python subclass of `core`: its instances have a __dict__ and take weak references (the
    core's fields stay its own: data descriptors shadow the dict)."""
    return type(f"Sub{core.__name__}", (core,), {})


def _core_instance(core: type) -> Any:
    """A new instance of `core`'s subclass."""
    return _subclass(core)({}) if core is native.ThresholdCore else _subclass(core)()


def _object_fields(core: type) -> list[str]:
    """The core's fields that hold any object assigned to them (its number fields refuse one,
    its read-only ones and the copies it makes, `run` and `heap`, do not keep it)."""
    fields = []
    for name, descriptor in sorted(vars(core).items()):
        if name.startswith("__") or not inspect.isdatadescriptor(descriptor):
            continue
        obj, fresh = _core_instance(core), _Fresh()
        try:
            setattr(obj, name, fresh)
        except (AttributeError, TypeError):
            continue
        if getattr(obj, name) is fresh:
            fields.append(name)
    return fields


@pytest.mark.parametrize("name", [c for c in CORES if c != "NativeMethod"])
def test_each_object_field_is_visited_cleared_and_released(name: str) -> None:
    """Every object field Python can set is reported by the type's traverse
    (`gc.get_referents`), cleared by its tp_clear (a cycle through the field alone, by a tuple,
    which has no tp_clear of its own, is collected) and released by its dealloc."""
    core = getattr(native, name)
    fields = _object_fields(core)
    assert fields, name
    for field in fields:
        obj, fresh = _core_instance(core), _Fresh()
        setattr(obj, field, fresh)
        assert any(r is fresh for r in gc.get_referents(obj)), field
        released = weakref.ref(fresh)
        del fresh
        del obj
        assert released() is None, f"{field}: not released by the dealloc"
        obj = _core_instance(core)
        setattr(obj, field, (obj,))
        collected = weakref.ref(obj)
        del obj
        gc.collect()
        assert collected() is None, f"{field}: a cycle through it is never broken"
    if core is native.ThresholdCore:  # `plain`, read-only, set by __init__; `at` made there
        plain: dict[Any, Any] = {}
        obj = _core_instance(core)
        obj.__init__(plain)
        assert obj.plain is plain
        referents = gc.get_referents(obj)
        assert any(r is plain for r in referents)
        assert any(r is obj.at for r in referents)


def test_a_native_methods_reference_and_module_are_visited_and_released() -> None:
    """The NativeMethod's table: its reference (cleared by a collection) and its module (kept
    until the dealloc)."""

    def reference(*args: Any, **kwargs: Any) -> None:
        return None

    method = native.function(reference, "_operation.expire_due")
    referents = gc.get_referents(method)
    assert any(r is reference for r in referents)
    assert any(r is native for r in referents)
    released = weakref.ref(reference)
    del reference, referents
    del method
    assert released() is None


# -- C functions held to a length a reviewer reads at once ---------------------------------------

#: Functions over the limit in files being rewritten when the limit came in: to be split into
#: named steps, and to leave this set (empty now: the wheel's and the timer's were split).
LONG_FOR_NOW: set[str] = set()


def _lengths_tool() -> Any:
    """tools/c_function_lengths.py, imported from the checkout (tools/ is not a package)."""
    path = CSRC.parents[1] / "tools" / "c_function_lengths.py"
    spec = importlib.util.spec_from_file_location("c_function_lengths", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_length_tool_finds_a_long_function_and_only_definitions(tmp_path: Path) -> None:
    """The tool reads the files' style: a definition from its name's line to its closing brace;
    prototypes, macros and calls at the start of a line are no definition."""
    tool = _lengths_tool()
    body = "\n".join(f"    x += {i};" for i in range(55))
    source = tmp_path / "sample.c"
    source.write_text(
        "static int long_one(int x);\n\n"
        "static int\nlong_one(int x)\n{\n" + body + "\n    return x;\n}\n\n"
        "/* a table */\nTYPE_LIFECYCLE(a, B, C, D, E, F)\n\n"
        "static inline int\nshort_one(void)\n{\n    return 0;\n}\n"
    )
    found = {f.name: f.length for f in tool.functions(source)}
    assert found == {"long_one": 59, "short_one": 4}
    assert [f.name for f in tool.too_long([source])] == ["long_one"]
    assert tool.main([str(source)]) == 1
    assert tool.main(["--limit", "60", str(source)]) == 0


def test_no_c_function_of_the_core_is_over_the_length_limit() -> None:
    """Every C function of the core at most `LIMIT` lines (a longer one is split into named
    steps, as the watch and the trigger are), but the ones listed in `LONG_FOR_NOW`, which must
    still be long (a list that only shrinks)."""
    tool = _lengths_tool()
    long = {f.name for f in tool.too_long(sorted(CSRC.glob("*.[ch]")))}
    assert long - LONG_FOR_NOW == set()
    assert LONG_FOR_NOW - long == set(), "split: remove them from LONG_FOR_NOW"


class _Entry:
    """A timer entry that is not an operation: the two attributes the wheel owns."""

    __slots__ = ("_bucket", "_deadline")

    def __init__(self) -> None:
        self._bucket: Bucket | None = None
        self._deadline = 0


def test_a_bucket_refuses_a_key_that_is_not_the_entrys_id() -> None:
    """The native bucket is a list, not a dict: it takes an entry under its own id only, and
    entries leave it by `remove` (the pure one is a dict keyed by ``id(entry)``, whose misuse
    this build refuses instead of keeping)."""
    wheel = TimingWheel(8, start_tick=0)
    entry, other = _Entry(), _Entry()
    wheel.add(entry, 3)
    bucket: Any = entry._bucket
    assert bucket is not None
    assert not isinstance(bucket, dict)
    with pytest.raises(ValueError, match="under its id"):
        bucket[id(entry)] = other
    with pytest.raises(TypeError, match="remove"):
        del bucket[id(entry)]
    assert list(bucket) == [entry]
