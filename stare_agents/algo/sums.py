"""Typed sums that become a step's figures: one field per sum, with its figure's name and divisor on the field.

    @dataclass
    class LossSums(Sums):
        tokens: float = 0.0                                           # a divisor only
        clipped: float = figure("policy/clipfrac", per="tokens")      # logged as clipped / tokens

    total = sums_a + sums_b                                  # over micro-batches
    total = LossSums.of(all_reduce_sum(total.vector()))      # over workers, in one call
    total.figures()                                          # {"policy/clipfrac": ...}, NaN where tokens is 0

A field may itself be a `Sums` (`field(default_factory=OtherSums)`): it is added, reduced and turned into
figures with its holder. A new figure is one field and one line where its sum is computed; the lists of names
(`names()`) follow from the types.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Container, Iterator, Mapping
from typing import Any, TypeVar

import torch
from torch import Tensor

FIGURE = "figure"  # field metadata: the name of the figure a sum becomes
S = TypeVar("S", bound="Sums")


def figure(name: str, *, per: str | None = None, needs: str | None = None) -> Any:
    """A summed field logged as the figure `name`: the sum itself, or divided by `per` (another field of the
    same sums, or a total the caller passes to `figures`). `needs`: what must have been measured in the step
    for the figure to exist (see `Sums.figures`)."""
    return dataclasses.field(default=0.0, metadata={FIGURE: name, "per": per, "needs": needs})


def _nested(f: dataclasses.Field) -> type[Sums] | None:
    factory = f.default_factory
    return factory if isinstance(factory, type) and issubclass(factory, Sums) else None


class Sums:
    """Base of a dataclass whose fields are float sums or other `Sums` (see the module docstring)."""

    def __add__(self: S, other: S) -> S:
        return type(self)(*(a + b for a, b in zip(self._fields(), other._fields(), strict=True)))

    def _fields(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]  # type: ignore[arg-type]

    def values(self) -> list[float]:
        """Every sum, nested ones included, in field order."""
        out: list[float] = []
        for value in self._fields():
            out += value.values() if isinstance(value, Sums) else [float(value)]
        return out

    def vector(self) -> Tensor:
        """The sums as one float64 tensor (for one all-reduce)."""
        return torch.tensor(self.values(), dtype=torch.float64)

    @classmethod
    def of(cls: type[S], values: Tensor | list[float]) -> S:
        """The sums from `values()`' order (e.g. an all-reduced `vector()`)."""
        flat = iter(values.tolist() if isinstance(values, Tensor) else values)
        return cls._read(flat)

    @classmethod
    def _read(cls: type[S], flat: Iterator[float]) -> S:
        args = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            nested = _nested(f)
            args.append(nested._read(flat) if nested is not None else float(next(flat)))
        return cls(*args)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The names of the figures, nested sums' included, in field order."""
        out: list[str] = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            nested = _nested(f)
            out += (
                nested.names() if nested is not None else [f.metadata[FIGURE]] if FIGURE in f.metadata else []
            )
        return tuple(out)

    def figures(
        self, totals: Mapping[str, float] | None = None, measured: Container[str] = ()
    ) -> dict[str, float]:
        """Each figure: its sum, or the sum over its `per` (a field of the same sums, else `totals[per]`); NaN
        (not measured: absent from metrics.jsonl) where `per` is 0 or what it `needs` is not in `measured`."""
        out: dict[str, float] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Sums):
                out.update(value.figures(totals, measured))
                continue
            if FIGURE not in f.metadata:
                continue
            per, needs = f.metadata["per"], f.metadata["needs"]
            value = float(value)
            if per is not None:
                divisor = getattr(self, per) if hasattr(self, per) else (totals or {})[per]
                value = value / divisor if divisor else math.nan
            out[f.metadata[FIGURE]] = math.nan if needs is not None and needs not in measured else value
        return out
