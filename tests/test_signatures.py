"""What `help()` and the API reference show of the public signatures: no private typing names."""

from __future__ import annotations

import inspect
import pydoc
import re

import pytest

import purgatory
from purgatory._purgatory import DEFAULT_WHEEL_SIZE
from purgatory.testing import ManualClock


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


@pytest.mark.parametrize(("name", "obj"), public_callables(), ids=str)
def test_no_private_typing_name_in_a_public_signature(name: str, obj: object) -> None:
    signature = str(inspect.signature(obj))  # type: ignore[arg-type]
    assert not re.search(r"\b_[A-Za-z]", signature), f"{name}{signature}"


def test_help_shows_watch_as_a_caller_writes_it() -> None:
    text = pydoc.plain(pydoc.render_doc(purgatory.DelayedOperationPurgatory.watch))
    assert "watch(self, op: 'Op', keys: 'Iterable[Hashable] | Mapping[Hashable, Any]')" in text
    assert "_Accepting" not in text


def test_the_default_wheel_size_is_written_out_and_agrees_with_its_constant() -> None:
    parameters = inspect.signature(purgatory.DelayedOperationPurgatory).parameters
    assert parameters["wheel_size"].default == DEFAULT_WHEEL_SIZE == 1024
