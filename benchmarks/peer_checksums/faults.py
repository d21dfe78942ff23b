"""The faults: nine classes (bits, zero, NaN, two whole-tile controls) and the seeded targets each class gets.

Fault classes (fp32; bf16 under ``--dtypes ...,bf16``, autocast on the CPU, with the bits in brackets): ``sign`` bit
31 [15]; ``exp-high`` bit 30 [14]; ``exp-low`` bit 23 [7]; ``mant-high`` one of bits 16..22 [4..6]; ``mant-low``
one of bits 0..7 [0..2]; ``zero``; ``nan``; the controls over a whole 16x16 tile of the output: ``tile-scale``
(every entry times ``1 + 2**-10`` [``1 + 2**-7``: ``2**-10`` is below bf16's resolution]) and ``tile-sign`` (every
entry negated). Each class gets the same ``--faults`` seeded targets (op and element), spread evenly over the
forward, dX and dW matmuls of the plain step's census; a fault is the dict the injector's ``Injector(fault=...)``
takes (:mod:`benchmarks.peer_checksums.injector`).
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["CLASSES", "PASSES", "BITS", "TILE_FACTOR", "plan_faults", "describe_class"]

CLASSES = ("sign", "exp-high", "exp-low", "mant-high", "mant-low", "zero", "nan", "tile-scale", "tile-sign")
PASSES = ("forward", "dX", "dW")
BITS = {
    "sign": (31, 15),
    "exp-high": (30, 14),
    "exp-low": (23, 7),
    "mant-high": ((16, 22), (4, 6)),
    "mant-low": ((0, 7), (0, 2)),
}
"""Bit positions, (fp32, bf16): one position, or a range one is drawn from."""
TILE_FACTOR = {"fp32": 1.0 + 2.0**-10, "bf16": 1.0 + 2.0**-7}


def plan_faults(census: list[dict[str, Any]], n: int, seed: int, dtype: str) -> dict[str, list[dict[str, Any]]]:
    """The same n targets (op and element) for every class, spread evenly over forward, dX and dW."""
    rng = random.Random(f"{seed}-{dtype}")
    by_pass = {p: [i for i, o in enumerate(census) if o["pass"] == p] for p in PASSES}
    targets = []
    for i in range(n):
        k = rng.choice(by_pass[PASSES[i % 3]])
        targets.append((k, [rng.randrange(s) for s in census[k]["out"]], rng.random()))
    bf = dtype == "bf16"
    out: dict[str, list[dict[str, Any]]] = {}
    for cls in CLASSES:
        rows = []
        crng = random.Random(f"{seed}-{dtype}-{cls}")
        for i, (k, element, _) in enumerate(targets):
            fault: dict[str, Any] = {"element": element}
            if cls in BITS:
                spec = BITS[cls][1 if bf else 0]
                fault.update(kind="bit", bit=crng.randint(*spec) if isinstance(spec, tuple) else spec)
            elif cls in ("zero", "nan", "tile-sign"):
                fault["kind"] = cls
            else:
                fault.update(kind="tile-scale", factor=TILE_FACTOR[dtype])
            rows.append({"i": i, "cls": cls, "target": k, "fault": fault})
        out[cls] = rows
    return out


def describe_class(cls: str, dtype: str) -> str:
    """A fault class in words (the table's second column)."""
    bf = dtype == "bf16"
    if cls in BITS:
        spec = BITS[cls][1 if bf else 0]
        return f"bit {spec}" if not isinstance(spec, tuple) else f"one of bits {spec[0]}..{spec[1]}"
    return {
        "zero": "set to 0",
        "nan": "set to NaN",
        "tile-sign": "16x16 tile negated",
        "tile-scale": f"16x16 tile x (1 + 2^-{10 if not bf else 7})",
    }[cls]
