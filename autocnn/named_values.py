"""The one object of each name of a kind of value (a Precision, a Layout): problems, records and the
command line hold these objects, and a name is turned into its object once, at the door, with an
error naming the allowed ones; unpickling asks for the object of a name too.
"""
from __future__ import annotations

from typing import Any, Generic, Iterable, TypeVar

from autocnn.errors import InvalidProblemError

T = TypeVar("T")


class NamedValues(Generic[T]):
    """The values of ``kind`` by their ``name``, in the order given (the order messages list them in)."""

    def __init__(self, kind: type[T], values: Iterable[T]) -> None:
        self.kind = kind
        self._by_name: dict[str, T] = {value.name: value for value in values}   # type: ignore[attr-defined]

    def named(self, value: Any, where: str, field: str) -> T:
        """The value a name (or a value of the kind) stands for; InvalidProblemError naming the
        allowed ones otherwise. ``where`` and ``field`` say whose value it was, for the message."""
        if isinstance(value, self.kind):
            return value
        found = self._by_name.get(value) if isinstance(value, str) else None
        if found is None:
            raise InvalidProblemError(where, field, value, f"one of {', '.join(self._by_name)}")
        return found

    def __getitem__(self, name: str) -> T:
        """The one object of a defined name (what unpickling asks for); KeyError for another."""
        return self._by_name[name]
