"""One name -> entry table, the shape every registry of torus-train takes (algorithms, launchers, data sources).

A table lives in the lowest package that reads it, so the spec, the CLI's choices and the docs' lists can be
derived from it without importing torch: an entry that needs torch names its implementation as
``"package.module:attribute"`` and `load` imports it only when a rank uses it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind by name, in the order they were added (the order help and docs list them in)."""

    def __init__(self, what: str):
        self.what = what  # "all-reduce algorithm", "launcher", "data source": used in messages
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Take an entry out again (a test that registered a toy entry cleans up with this)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"unknown {self.what} {name!r}; choose one of {', '.join(self._entries)}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[T]:
        return iter(self._entries.values())

    def items(self):
        return self._entries.items()


def load(ref: str | Callable) -> Any:
    """The object a ``"package.module:attribute"`` reference names (imported now), or ``ref`` if it is one."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
