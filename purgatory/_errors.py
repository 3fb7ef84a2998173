"""The purgatory's exception family: one base class, a subclass per lifecycle failure.

Bad arguments raise the builtin ``ValueError`` / ``TypeError`` instead, so that ``except
PurgatoryError`` catches exactly the failures a correct program must still handle.
"""

from __future__ import annotations

__all__ = ("OperationCancelled", "PurgatoryClosed", "PurgatoryError", "PurgatoryFull")


class PurgatoryError(Exception):
    """Base class of every error the purgatory raises on purpose."""


class OperationCancelled(PurgatoryError):
    """The awaited operation was cancelled: it will never complete nor expire."""


class PurgatoryClosed(OperationCancelled):
    """The purgatory was shut down: it accepts no operation and cancelled the pending ones.

    It derives from `OperationCancelled` because an awaiter of an operation cancelled by the
    shutdown sees this error, and code that handles cancellation should handle it too.
    """


class PurgatoryFull(PurgatoryError):
    """`max_pending` operations are already delayed: shed load or retry later."""
