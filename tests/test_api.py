"""The public face of the package (`purgatory/__init__.py`): exported names, imports, the
exception family, reprs, and what `help()` and the API reference show of the signatures."""

from __future__ import annotations

import inspect
import pydoc
import re
import subprocess
import sys

import pytest
from helpers import FlagOperation, manual_purgatory

import purgatory
from purgatory import (
    DelayedOperationPurgatory,
    OperationCancelled,
    PurgatoryClosed,
    PurgatoryError,
    PurgatoryFull,
)
from purgatory._purgatory import DEFAULT_WHEEL_SIZE
from purgatory.testing import ManualClock


def test_all_is_exactly_the_public_names() -> None:
    public = {name for name in vars(purgatory) if not name.startswith("_")}
    public -= {"annotations", "testing", "pipeline", "asgi", "prometheus", "otel"}
    assert set(purgatory.__all__) == public
    assert isinstance(purgatory.__all__, tuple)
    for name in purgatory.__all__:
        if name != "IMPLEMENTATION":  # (a string)
            assert getattr(purgatory, name).__module__ == "purgatory", name
    assert purgatory.IMPLEMENTATION in ("native", "python")
    assert ManualClock.__module__ == "purgatory.testing"


def test_import_pulls_in_only_the_standard_library() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import purgatory, purgatory.testing, purgatory.asgi\n"
        "names = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(n for n in names if n not in sys.stdlib_module_names "
        "and n not in ('purgatory', '__main__')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_arrow_event_log_says_what_to_install_without_pyarrow(tmp_path: object) -> None:
    code = (
        "import sys\n"
        "sys.modules['pyarrow'] = None\n"
        "import purgatory\n"
        "assert 'ArrowEventLog' in purgatory.__all__\n"
        "try:\n"
        f"    purgatory.ArrowEventLog({str(tmp_path)!r})\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'asyncio-purgatory[arrow]'" in out.stdout


def test_exception_family() -> None:
    for error in (OperationCancelled, PurgatoryClosed, PurgatoryFull):
        assert issubclass(error, PurgatoryError)
    assert issubclass(PurgatoryClosed, OperationCancelled)


def test_reprs_show_the_public_path_and_state() -> None:
    _, p = manual_purgatory("api")
    op = FlagOperation(1)
    assert "new" in repr(op)
    p.try_complete_else_watch(op, ["a"])
    assert "watched" in repr(op)
    assert repr(p).startswith("<DelayedOperationPurgatory 'api' open")
    op.ready = True
    p.check_and_complete("a")
    assert "completed" in repr(op)
    assert repr(DelayedOperationPurgatory).endswith("'purgatory.DelayedOperationPurgatory'>")


# -- signatures: no private typing names ----------------------------------------------------------


def public_callables() -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    for name in purgatory.__all__:
        obj = getattr(purgatory, name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            found.append((name, obj))
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and callable(member):
                    found.append((f"{name}.{attr}", member))
    found.append(("ManualClock.advance_to", ManualClock.advance_to))
    return found


@pytest.mark.parametrize(
    ("name", "obj"), [pytest.param(name, obj, id=name) for name, obj in public_callables()]
)
def test_no_private_typing_name_in_a_public_signature(name: str, obj: object) -> None:
    signature = str(inspect.signature(obj))  # type: ignore[arg-type]
    assert not re.search(r"\b_[A-Za-z]", signature), f"{name}{signature}"


def test_help_shows_watch_as_a_caller_writes_it() -> None:
    text = pydoc.plain(pydoc.render_doc(purgatory.DelayedOperationPurgatory.watch))
    assert (
        "watch(self, op: 'Op', keys: 'Iterable[Hashable] | Mapping[Hashable, Any]', "
        "threshold: 'Any' = None)"
    ) in text
    assert "_Accepting" not in text


def test_the_default_wheel_size_is_written_out_and_agrees_with_its_constant() -> None:
    parameters = inspect.signature(purgatory.DelayedOperationPurgatory).parameters
    assert parameters["wheel_size"].default == DEFAULT_WHEEL_SIZE == 1024


# -- help() of every public callable describes its arguments ----------------------------------

#: Public classes whose constructor users never call: the purgatory builds its statistics (each
#: field is documented where it is declared).
BUILT_FOR_USERS = {"purgatory.PurgatoryStatistics"}


def undocumented_arguments(obj: object) -> list[str]:
    """The parameters of `obj` (but ``self``) that its docstring's ``Args:`` section, which
    ``help()`` shows, does not name."""
    try:
        parameters = inspect.signature(obj).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    doc = inspect.getdoc(obj) or ""
    section = re.search(r"^Args:\n((?:    .*\n?|\n)*)", doc, re.MULTILINE)
    named = set(re.findall(r"^    \*{0,2}(\w+)(?: \(.*?\))?:", section[1] if section else "", re.M))
    return [p.name for p in parameters if p.name not in {"self", "cls"} | named]


def every_public_callable() -> list[tuple[str, object]]:
    import purgatory.asgi
    import purgatory.otel
    import purgatory.prometheus
    import purgatory.testing

    found: list[tuple[str, object]] = []
    modules = (purgatory, purgatory.testing, purgatory.asgi, purgatory.prometheus, purgatory.otel)
    for module in modules:
        for name in module.__all__:
            obj = getattr(module, name)
            where = f"{module.__name__}.{name}"
            if inspect.isclass(obj):
                constructed = obj.__init__ is not object.__init__ and not getattr(
                    obj, "_is_protocol", False
                )
                if constructed and where not in BUILT_FOR_USERS:
                    found.append((where, obj))
                found += [
                    (f"{where}.{attr}", getattr(obj, attr))
                    for attr, member in vars(obj).items()
                    if not attr.startswith("_") and inspect.isfunction(member)
                ]
            elif callable(obj):
                found.append((where, obj))
    return found


def test_help_of_every_public_callable_describes_its_arguments() -> None:
    found = every_public_callable()
    assert len(found) > 40  # the scan sees the API
    missing = {where: names for where, obj in found if (names := undocumented_arguments(obj))}
    assert missing == {}


def test_the_argument_check_sees_an_undocumented_one() -> None:
    def documented(a: int, b: int) -> None:
        """Do.

        Args:
            a: One.
        """

    assert undocumented_arguments(documented) == ["b"]
