"""Options registered by a registry (each entry adds its own argparse options: a method's need, a benchmark), taken
from the parsed command line as one immutable object: :class:`Options`, a frozen mapping from each declared option's
destination to its value, read as attributes (``options.recall_shots``). It holds the options the registry's
``add_arguments`` declared (:func:`dests_of`) and nothing else of the command line."""
from __future__ import annotations

import argparse
from dataclasses import FrozenInstanceError
from typing import Any, Callable, Iterable, Iterator, Mapping


def dests_of(add_arguments: Callable[[argparse.ArgumentParser], None]) -> tuple[str, ...]:
    """The destinations (``Namespace`` attributes) of the options that ``add_arguments`` adds to a parser, in order."""
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    return tuple(vars(p.parse_args([])))


def frozen(value: Any) -> Any:
    """``value`` with its lists as tuples (nested too): an option's value fit for a frozen, hashable object."""
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


class Options(Mapping[str, Any]):
    """A frozen mapping {option destination: value} read as attributes too; assigning raises
    ``dataclasses.FrozenInstanceError``, reading an option not held raises AttributeError (KeyError as a mapping)."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        object.__setattr__(self, "_values", {k: frozen(v) for k, v in dict(values).items()})

    @classmethod
    def of(cls, given: Mapping[str, Any], dests: Iterable[str], **extra: Any) -> Options:
        """The options ``dests`` out of the parsed command line ``given`` (``vars(namespace)``): those only; an
        option declared but not parsed is a KeyError (the command does not have it)."""
        return cls({d: given[d] for d in dests}, **extra)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} holds no option {name!r} (it holds: "
                                 f"{', '.join(self._values) or 'none'})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to option {name!r}: {type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete option {name!r}: {type(self).__name__} is frozen")

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values == other._values

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._values!r})"

    def __reduce__(self):
        return type(self), (self._values,)

    def with_values(self, **values: Any) -> Options:
        """A copy with ``values`` added (or replacing those of the same name)."""
        return type(self)({**self._values, **values})
