"""Topic names: Kafka's rules (``org.apache.kafka.common.internals.Topic``), checked before any
topic is created.

Kafka refuses a name that is empty, ``.`` or ``..``, longer than 249 characters, or that has a
character other than ASCII letters, digits, ``.``, ``_`` and ``-``; such a name could not be a
directory of the log, nor a metric name. It also refuses a new topic whose name differs from an
existing one only by ``.`` against ``_`` (the two collide in metric names). Both answers are
``INVALID_TOPIC_EXCEPTION``, with Kafka's message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ("MAX_NAME_LENGTH", "collision", "invalid_name")

MAX_NAME_LENGTH = 249
"""Kafka's ``Topic.MAX_NAME_LENGTH``: 255 for a file name, less room for a partition suffix."""

_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def invalid_name(name: str) -> str | None:
    """Why Kafka refuses `name` as a topic name (its ``Topic.validate`` message), or ``None``."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return 'Topic name cannot be "." or ".."'
    if len(name) > MAX_NAME_LENGTH:
        return (
            f"Topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters, "
            f"Topic name: {name}"
        )
    if not _LEGAL.fullmatch(name):
        return (
            f'Topic name "{name}" is illegal, it contains a character other than ASCII '
            "alphanumerics, '.', '_' and '-'"
        )
    return None


def collision(name: str, existing: Iterable[str]) -> str | None:
    """Why a new topic `name` collides with an existing one (``.`` and ``_`` are one), or
    ``None``. The existing topic of that very name is not a collision (it already exists)."""
    unified = name.replace(".", "_")
    for other in existing:
        if other != name and other.replace(".", "_") == unified:
            return f"Topic '{name}' collides with existing topic: {other}"
    return None
