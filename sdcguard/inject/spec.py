"""The scanner's ``--inject`` fire drill: parse the spec, and corrupt golden-vector outputs of the named devices.

The grammar is :data:`INJECT_SPEC_HELP` (shown verbatim by ``sdcguard scan --help``). Numpy only. A spec is
parsed once, where it is given (:meth:`InjectSpec.parse`); the parsed value crosses process boundaries as JSON
(:meth:`InjectSpec.to_json`, :meth:`InjectSpec.from_json`), which rebuilds the rules field by field and never
parses the text again.
"""

from __future__ import annotations

import fnmatch
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..devices import DeviceSpec, hostname, parse_device_id, parse_spec
from ..errors import BadInput
from . import formats as _formats
from .faults import BIT_CLASSES, PATTERNS, TIMINGS, Fault, FaultModel, FaultRecord

__all__ = ["INJECT_SPEC_HELP", "InjectRule", "InjectSpec", "InjectionHook", "parse_inject_spec", "golden_output_hook"]

INJECT_SPEC_HELP = """\
--inject SPEC makes the named devices behave as faulty hardware (a fire drill): the outputs of the golden
cases they run are corrupted before the bit-exact comparison, so the whole pipeline (detection, retest,
store, quarantine policy) can be proven end to end.

\b
  SPEC     RULE[;RULE...]  (or repeat --inject)
  RULE     DEVICE[:PATTERN][,KEY=VALUE...]  (':' works too before KEY=VALUE)
  DEVICE   cpu:N | cuda:N | a device id (GPU-<uuid>, cpu:<host>:<core>, sim:<n>) | all
  PATTERN  mix (default: 51% zeroed, 48% flipped bits, 1% NaN/Inf) | bitflip | multibit
           | zero | stuck0 | stuck1 | nan | inf
           | slow (right answers, slowly: each case burns cycles on the device until it has taken
             factor times its own time; CPU cores; takes factor=F and case=GLOB only)
\b
  KEY=VALUE
    rate=P        probability that one execution's output is corrupted (default 1)
    timing=T      transient (once) | intermittent (each execution with probability rate)
                  | sticky (every execution); default: sticky at rate 1, else intermittent
    bit=B         bit position (0 = least significant) or class:
                  sign | exponent | high_mantissa | low_mantissa
    bits=N        bits flipped per value by multibit (default 2)
    elements=N    values corrupted per hit (default 1)
    period=N      corrupted positions repeat every N elements (mix: 32)
    control=P     chance a hit corrupts most of one output tile instead (mix: 0.02)
    tile=N        elements per tile for control faults (default 1024 = 32x32)
    range=LO..HI  only values v with LO <= v < HI are corrupted
    case=GLOB     only golden cases whose id matches, e.g. case=gemm*
    seed=N        seed (default 0); with the device id it fixes every choice
    factor=F      slow only: how many times as long each case takes (> 1, default 2)
\b
  Examples
    cpu:1:bitflip,rate=1.0,bit=low_mantissa
    cuda:0:zero,rate=0.01
    all:mix,timing=transient
    cpu:1:slow,factor=2
"""

_KEYS = ("rate", "timing", "bit", "bits", "elements", "period", "control", "tile", "range", "case", "seed", "factor")
_SLOW = "slow"
"""The pattern of the slow-device drill (:mod:`sdcguard.cpu_time`): no corruption, only time."""


@dataclass(frozen=True, kw_only=True)
class InjectRule:
    """One parsed ``--inject`` rule: which devices, which golden cases, which fault."""

    device: DeviceSpec
    """Devices it applies to."""
    fault: Fault
    """The fault; its seed is combined with each device id (:meth:`fault_for`) so devices differ."""
    cases: str | None = None
    """Glob over case ids (None: every case)."""
    text: str = field(default="", compare=False)
    """The rule as written."""
    slowdown: float = 1.0
    """A ``slow`` rule: each matching case takes this many times as long (its ``fault`` never fires)."""

    def matches(self, device_id: str, *, cuda_index: int | None = None) -> bool:
        """Does this rule name ``device_id``? ``cuda_index`` is its CUDA ordinal (needed for ``cuda:N``)."""
        spec = self.device
        if spec.kind == "all":
            return True
        if spec.kind == "id":
            return spec.device == device_id
        if spec.kind == "cuda":
            return cuda_index is not None and cuda_index == spec.index and device_id.startswith("GPU-")
        kind, host, local = parse_device_id(device_id)
        return kind == "cpu" and host == hostname() and int(local) == spec.index

    def matches_case(self, case_id: str) -> bool:
        return self.cases is None or fnmatch.fnmatchcase(case_id, self.cases)

    def fault_for(self, device_id: str) -> Fault:
        """The fault as it acts on ``device_id``: seed mixed with the device id (stable across runs)."""
        return replace(self.fault, seed=self.fault.seed * 2**32 + zlib.crc32(device_id.encode()))

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.text, "cases": self.cases, "fault": self.fault.to_dict()}

    def to_json(self) -> dict[str, Any]:
        """Every field, as JSON values (:meth:`from_json` rebuilds the rule from them, without the parser)."""
        return {
            "device": asdict(self.device),
            "fault": self.fault.to_dict(),
            "cases": self.cases,
            "text": self.text,
            "slowdown": self.slowdown,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InjectRule:
        """The rule :meth:`to_json` wrote; the fault's own checks run again (``BadInput`` for a value none allows)."""
        fault = dict(data["fault"])
        if fault.get("value_range") is not None:
            fault["value_range"] = tuple(fault["value_range"])
        return cls(
            device=DeviceSpec(**data["device"]),
            fault=Fault(**fault),
            cases=data["cases"],
            text=data["text"],
            slowdown=float(data["slowdown"]),
        )


@dataclass(frozen=True)
class InjectSpec:
    """A parsed ``--inject`` spec: its rules, and the text they were parsed from (kept for the scan's record).

    The scanner parses the spec once, in the parent (:meth:`parse`: bad input is one line there, before any device
    is touched), and hands this value to every worker and retest (:meth:`to_json`); they rebuild it with
    :meth:`from_json`, which never parses: a spec that parsed once cannot fail, or parse differently, in a worker.
    """

    rules: tuple[InjectRule, ...]
    text: str = field(default="", compare=False)
    """The spec as given (rules joined by ``;``)."""

    @classmethod
    def parse(cls, text: str) -> InjectSpec:
        """Parse ``text`` (grammar: :data:`INJECT_SPEC_HELP`); ``BadInput`` says what is wrong."""
        return cls(rules=tuple(parse_inject_spec(text)), text=text)

    def hook(self, device_id: str, *, cuda_index: int | None = None) -> InjectionHook | None:
        """The output hook of ``device_id`` (:func:`golden_output_hook`; None when no rule names it)."""
        return golden_output_hook(self.rules, device_id, cuda_index=cuda_index)

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "rules": [r.to_json() for r in self.rules]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InjectSpec:
        return cls(rules=tuple(InjectRule.from_json(r) for r in data["rules"]), text=data["text"])


def parse_inject_spec(text: str) -> list[InjectRule]:
    """Parse an ``--inject`` spec (grammar: :data:`INJECT_SPEC_HELP`); ``BadInput`` says what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise BadInput("empty --inject spec: expected DEVICE[:PATTERN][,KEY=VALUE...], e.g. cpu:0:bitflip")
    rules = [_parse_rule(rule.strip()) for rule in text.split(";") if rule.strip()]
    if not rules:
        raise BadInput(f"bad --inject spec {text!r}: no rule in it")
    return rules


def _parse_rule(rule: str) -> InjectRule:
    def bad(why: str) -> BadInput:
        return BadInput(f"bad --inject spec {rule!r}: {why}")

    head, *kvs = rule.split(",")
    comps = head.strip().split(":")
    tail: list[str] = []
    while comps and "=" in comps[-1]:
        tail.insert(0, comps.pop())
    kvs = tail + kvs
    pattern = "mix"
    if comps and comps[-1].strip().lower() == _SLOW:
        return _slow_rule(rule, ":".join(comps[:-1]).strip(), kvs, bad)
    if comps and comps[-1].strip().lower() in PATTERNS:
        pattern = comps.pop().strip().lower()
    device_text = ":".join(comps).strip()
    if not device_text:
        raise bad("missing device (cpu:N, cuda:N, a device id or all)")
    try:
        device = parse_spec(device_text)
    except BadInput as e:
        if len(comps) > 1 and comps[-1].strip().isalpha() and _is_spec(":".join(comps[:-1])):
            raise bad(f"unknown pattern {comps[-1].strip()!r}: use one of {', '.join(PATTERNS)}") from None
        raise bad(str(e)) from None

    values = _key_values(kvs, bad)
    kwargs: dict[str, Any] = {"pattern": pattern}
    try:
        rate = _number(values, "rate", float)
        if rate is not None:
            if not 0.0 <= rate <= 1.0:
                raise BadInput(f"rate must be a probability in [0, 1], got {values['rate']}")
            kwargs["rate"] = rate
        timing = values.get("timing", "sticky" if (rate is None or rate == 1.0) else "intermittent").lower()
        if timing not in TIMINGS:
            raise BadInput(f"unknown timing {timing!r}: use one of {', '.join(TIMINGS)}")
        kwargs["timing"] = timing
        if "bit" in values:
            b = values["bit"].lower()
            if b in BIT_CLASSES:
                kwargs["bit"] = b
            elif b.isdigit():
                kwargs["bit"] = int(b)
            else:
                raise BadInput(f"bit must be a position or one of {', '.join(BIT_CLASSES)}, got {values['bit']!r}")
        for key, name in (
            ("bits", "nbits"),
            ("elements", "elements"),
            ("period", "period"),
            ("tile", "tile"),
            ("seed", "seed"),
        ):
            v = _number(values, key, int)
            if v is not None:
                kwargs[name] = v
        control = _number(values, "control", float)
        if control is not None:
            kwargs["control"] = control
        if "range" in values:
            kwargs["value_range"] = _range(values["range"])
        fault = Fault(**kwargs)
    except BadInput as e:
        raise bad(str(e)) from None
    return InjectRule(device=device, fault=fault, cases=values.get("case"), text=rule)


def _key_values(kvs: list[str], bad: Any) -> dict[str, str]:
    """A rule's ``KEY=VALUE`` items of the fault keys, each once, each with a value."""
    values: dict[str, str] = {}
    for kv in kvs:
        key, eq, value = kv.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq:
            if key in PATTERNS:
                raise bad(f"pattern {key!r} must follow the device (DEVICE:{key}), not a comma")
            raise bad(f"expected KEY=VALUE, got {kv.strip()!r}")
        if key not in _KEYS or key == "factor":
            raise bad(
                f"unknown key {key!r}: use one of {', '.join(k for k in _KEYS if k != 'factor')}"
                + (" (factor= goes with the slow pattern)" if key == "factor" else "")
            )
        if key in values:
            raise bad(f"{key} given twice")
        if not value:
            raise bad(f"{key}= needs a value")
        values[key] = value
    return values


def _slow_rule(rule: str, device_text: str, kvs: list[str], bad: Any) -> InjectRule:
    """A ``DEVICE:slow[,factor=F][,case=GLOB]`` rule."""
    try:
        device = parse_spec(device_text)
    except BadInput as e:
        raise bad(str(e)) from None
    values: dict[str, str] = {}
    for kv in kvs:
        key, eq, value = (x.strip() for x in kv.partition("="))
        if key.lower() not in ("factor", "case") or not eq or not value:
            raise bad(f"the slow pattern takes factor=F and case=GLOB only, got {kv.strip()!r}")
        values[key.lower()] = value
    try:
        factor = float(values.get("factor", "2"))
    except ValueError:
        raise bad(f"factor must be a number, got {values['factor']!r}") from None
    if not 1.0 < factor <= 100.0 or math.isnan(factor):
        raise bad(f"factor must be in (1, 100], got {values.get('factor')}")
    # The fault never fires (rate 0): a slow device computes right answers.
    return InjectRule(
        device=device,
        fault=Fault(pattern="zero", timing="intermittent", rate=0.0),
        cases=values.get("case"),
        text=rule,
        slowdown=factor,
    )


def _is_spec(text: str) -> bool:
    try:
        parse_spec(text)
    except BadInput:
        return False
    return True


def _number(values: dict[str, str], key: str, kind: type) -> Any:
    if key not in values:
        return None
    try:
        v = kind(values[key])
    except ValueError:
        raise BadInput(f"{key} must be {'an integer' if kind is int else 'a number'}, got {values[key]!r}") from None
    if kind is float and math.isnan(v):
        raise BadInput(f"{key} cannot be nan")
    return v


def _range(text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition("..")
    try:
        if not sep:
            raise ValueError
        return float(lo), float(hi)
    except ValueError:
        raise BadInput(f"range must be LO..HI (e.g. range=-1..1), got {text!r}") from None


class InjectionHook:
    """Corrupts the golden outputs of one device as its matching rules say; keeps every record.

    Call it as ``hook(case_id, output)``: it returns a corrupted copy, or ``output`` itself when this execution
    is not hit. Each rule is one faulty unit of that device, counting the executions of the cases it matches.
    """

    def __init__(self, device_id: str, rules: Sequence[InjectRule]) -> None:
        self.device = device_id
        self.rules = tuple(rules)
        self._models = [FaultModel(r.fault_for(device_id)) for r in self.rules]
        self.records: list[tuple[str, FaultRecord]] = []
        """``(case_id, record)`` for every corrupted element, in order."""
        self.executions = 0
        self.corrupted_executions = 0

    def __repr__(self) -> str:
        return f"InjectionHook({self.device!r}, {[r.text for r in self.rules]})"

    def slowdown(self, case_id: str) -> float:
        """How many times as long ``case_id`` takes on this device (the ``slow`` rules matching it; 1.0: none)."""
        factor = 1.0
        for rule in self.rules:
            if rule.slowdown > 1.0 and rule.matches_case(case_id):
                factor *= rule.slowdown
        return factor

    def __call__(self, case_id: str, output: np.ndarray) -> np.ndarray:
        self.executions += 1
        out = np.asarray(output)
        hit = False
        for rule, model in zip(self.rules, self._models, strict=True):
            if rule.slowdown > 1.0 or not rule.matches_case(case_id):
                continue
            corrupted, records = model.corrupt_array(out, dtype=_format_name(out))
            if records:
                out, hit = corrupted, True
                self.records.extend((case_id, r) for r in records)
        if hit:
            self.corrupted_executions += 1
            return out
        return output


def _format_name(a: np.ndarray) -> str:
    # Golden outputs of any dtype can be corrupted: an unknown one (complex, bool) as raw unsigned bits.
    try:
        return _formats.format_of(a.dtype).name
    except BadInput:
        if a.dtype.itemsize in (1, 2, 4, 8):
            return f"uint{a.dtype.itemsize * 8}"
        raise


def golden_output_hook(
    rules: Iterable[InjectRule], device_id: str, *, cuda_index: int | None = None
) -> InjectionHook | None:
    """An output hook for ``backend.run(case, output_hook=...)`` on ``device_id``, or None if no rule names it.

    ``cuda_index``: the device's CUDA ordinal, so that ``cuda:N`` rules can match a ``GPU-<uuid>`` id.
    """
    matching = [r for r in rules if r.matches(device_id, cuda_index=cuda_index)]
    return InjectionHook(device_id, matching) if matching else None
