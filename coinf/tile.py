"""A tile of MeDNN's spatial partition: the rectangle of one layer's output that one device
computes (docs/SPATIAL.md); a TILE request names it on the wire (docs/PROTOCOL.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tile:
    """A rectangle of the spatial chain's output: layers [i0, i1), rows [r0, r1), columns
    [c0, c1) of layer ``i1 - 1``'s output map."""

    i0: int
    i1: int
    r0: int
    r1: int
    c0: int
    c1: int

    def __post_init__(self) -> None:
        vals = (self.i0, self.i1, self.r0, self.r1, self.c0, self.c1)
        if not all(0 <= v <= 0xFFFF for v in vals):
            raise ValueError(f"tile {vals}: every field is a u16")

    def __str__(self) -> str:
        return f"tile {self.i0}-{self.i1} rows {self.r0}-{self.r1} cols {self.c0}-{self.c1}"
