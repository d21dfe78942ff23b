"""The scanner's --inject fire drill: the spec grammar, its bad inputs, and the golden output hook."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdcguard.devices import DeviceSpec, cpu_id, hostname, sim_id
from sdcguard.errors import BadInput
from sdcguard.inject import INJECT_SPEC_HELP, Fault, InjectSpec, golden_output_hook, parse_inject_spec
from sdcguard.inject import spec as spec_module
from sdcguard.inject.faults import BIT_CLASSES, PATTERNS, TIMINGS
from sdcguard.inject.spec import _KEYS

GPU = "GPU-0123abcd-0000-1111-2222-333344445555"


def test_the_documented_examples():
    (r,) = parse_inject_spec("cpu:1:bitflip,rate=1.0,bit=low_mantissa")
    assert r.device == DeviceSpec(kind="cpu", index=1)
    assert r.fault == Fault(pattern="bitflip", bit="low_mantissa", timing="sticky")
    (r,) = parse_inject_spec("cuda:0:zero,rate=0.01")
    assert r.device == DeviceSpec(kind="cuda", index=0)
    assert r.fault == Fault(pattern="zero", rate=0.01, timing="intermittent")
    (r,) = parse_inject_spec("all:mix,timing=transient")
    assert r.device.kind == "all" and r.fault == Fault(pattern="mix", timing="transient")


def test_colon_before_options_and_defaults():
    (r,) = parse_inject_spec("cpu:1:bitflip:rate=1.0")  # the brief's spelling
    assert r.fault == Fault(pattern="bitflip")
    (r,) = parse_inject_spec("sim:3")
    assert r.device == DeviceSpec(kind="id", device="sim:3") and r.fault == Fault()
    (r,) = parse_inject_spec(f"{GPU}:stuck1,bit=30,elements=4,period=32,range=-1..inf,case=gemm*,seed=9")
    assert r.device == DeviceSpec(kind="id", device=GPU) and r.cases == "gemm*"
    assert r.fault == Fault(pattern="stuck1", bit=30, elements=4, period=32, value_range=(-1.0, math.inf), seed=9)
    (r,) = parse_inject_spec(f"cpu:{hostname()}:2:multibit,bits=3,bit=exponent,control=0.5,tile=64")
    assert r.device == DeviceSpec(kind="id", device=cpu_id(2))
    assert r.fault == Fault(pattern="multibit", nbits=3, bit="exponent", control=0.5, tile=64)


def test_several_rules():
    rules = parse_inject_spec("cpu:0:zero; cuda:1:nan,rate=0.5;")
    assert [r.fault.pattern for r in rules] == ["zero", "nan"]
    assert rules[1].fault.timing == "intermittent"


@given(
    pattern=st.sampled_from(PATTERNS),
    timing=st.sampled_from(TIMINGS),
    rate=st.floats(0.0, 1.0),
    bit=st.one_of(st.none(), st.integers(0, 63), st.sampled_from(BIT_CLASSES)),
    elements=st.integers(1, 1000),
    period=st.one_of(st.none(), st.integers(0, 512)),
    seed=st.integers(0, 2**63),
    lo=st.floats(-1e30, 1e30),
)
def test_spec_round_trip(pattern, timing, rate, bit, elements, period, seed, lo):
    """Every valid fault can be written as a spec and parsed back to itself."""
    if timing == "sticky":
        rate = 1.0
    if pattern in ("zero", "nan", "inf", "mix") or (pattern == "multibit" and isinstance(bit, int)):
        bit = None
    hi = lo + abs(lo) + 1.0
    fault = Fault(
        pattern=pattern,
        timing=timing,
        rate=rate,
        bit=bit,
        elements=elements,
        period=period,
        seed=seed,
        value_range=(lo, hi),
    )
    text = f"cpu:0:{pattern},timing={timing},rate={rate!r},elements={elements},seed={seed},range={lo!r}..{hi!r}"
    if bit is not None:
        text += f",bit={bit}"
    if period is not None:
        text += f",period={period}"
    (rule,) = parse_inject_spec(text)
    assert rule.fault == fault


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty"),
        ("  ;  ", "no rule"),
        ("gpu:1", "bad device spec"),
        ("cpu:1:flip", "unknown pattern 'flip'"),
        ("cpu:1,zero", "must follow the device"),
        ("cpu:1:zero,foo=1", "unknown key 'foo'"),
        ("cpu:1:zero,rate", "expected KEY=VALUE"),
        ("cpu:1:zero,rate=", "needs a value"),
        ("cpu:1:zero,rate=2", "probability"),
        ("cpu:1:zero,rate=x", "must be a number"),
        ("cpu:1:zero,rate=nan", "cannot be nan"),
        ("cpu:1:zero,rate=0.1,rate=0.2", "twice"),
        ("cpu:1:zero,timing=always", "unknown timing"),
        ("cpu:1:zero,timing=sticky,rate=0.5", "sticky"),
        ("cpu:1:bitflip,bit=mantissa", "bit must be"),
        ("cpu:1:zero,bit=3", "does not take a bit"),
        ("cpu:1:bitflip,bit=99", "0..63"),
        ("cpu:1:multibit,bit=3", "bit class"),
        ("cpu:1:zero,range=1..0", "lo < hi"),
        ("cpu:1:zero,range=1", "LO..HI"),
        ("cpu:1:zero,elements=0", "elements"),
        ("cpu:1:zero,elements=1.5", "integer"),
        ("cpu:1:zero,seed=-3", "seed"),
        (":zero", "missing device"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(BadInput, match=message) as e:
        parse_inject_spec(spec)
    assert "\n" not in str(e.value)
    if spec.strip(" ;"):
        assert spec.split(";")[0].strip() in str(e.value), "the message names the rule"


def test_help_documents_every_pattern_timing_and_key():
    for word in (*PATTERNS, *TIMINGS, *BIT_CLASSES, *(f"{k}=" for k in _KEYS)):
        assert word in INJECT_SPEC_HELP
    examples = [line.strip() for line in INJECT_SPEC_HELP.split("Examples")[1].splitlines() if line.strip()]
    assert len(examples) >= 3
    for example in examples:
        parse_inject_spec(example)  # every example parses


def test_hook_matches_the_named_devices_only():
    rules = parse_inject_spec(f"cpu:1:zero;{sim_id(4)}:zero;cuda:2:zero;{GPU}:nan")
    assert golden_output_hook(rules, cpu_id(1)) is not None
    assert golden_output_hook(rules, cpu_id(1, host="elsewhere")) is None
    assert golden_output_hook(rules, cpu_id(0)) is None
    assert golden_output_hook(rules, sim_id(4)) is not None
    assert golden_output_hook(rules, sim_id(5)) is None
    other = "GPU-ffffffff-0000-1111-2222-333344445555"
    assert golden_output_hook(rules, other) is None
    assert golden_output_hook(rules, other, cuda_index=2) is not None
    assert golden_output_hook(rules, other, cuda_index=1) is None
    hook = golden_output_hook(rules, GPU)
    assert hook is not None and [r.fault.pattern for r in hook.rules] == ["nan"]
    assert golden_output_hook(parse_inject_spec("all"), sim_id(0)) is not None


def test_hook_corrupts_and_records_a_copy():
    hook = golden_output_hook(parse_inject_spec("sim:0:bitflip,elements=3"), sim_id(0))
    assert hook is not None
    expected = np.arange(100, dtype=np.float32).reshape(10, 10)
    out = hook("gemm_f32", expected)
    assert out is not expected and np.array_equal(expected, np.arange(100, dtype=np.float32).reshape(10, 10))
    diff = np.flatnonzero(out.reshape(-1).view(np.uint32) != expected.reshape(-1).view(np.uint32))
    assert sorted(r.index for _, r in hook.records) == diff.tolist()
    assert {case for case, _ in hook.records} == {"gemm_f32"}
    assert hook.executions == hook.corrupted_executions == 1


def test_hook_rate_is_per_execution():
    hook = golden_output_hook(parse_inject_spec("sim:0:zero,rate=0.2,seed=1"), sim_id(0))
    a = np.ones(16, dtype=np.int32)
    results = [hook("c", a) for _ in range(2000)]
    hit = sum(r is not a for r in results)
    assert hit == hook.corrupted_executions
    assert abs(hit - 400) < 5 * math.sqrt(2000 * 0.2 * 0.8)
    assert all(r is a for r in results if not np.any(r != a)), "an execution not hit returns the output itself"


def test_sticky_hook_reproduces_on_retest_and_devices_differ():
    rules = parse_inject_spec("all:mix,elements=4")
    a = np.random.default_rng(0).standard_normal(4096)
    h0, h1 = golden_output_hook(rules, sim_id(0)), golden_output_hook(rules, sim_id(1))
    first, retest = h0("c", a), h0("c", a)
    assert first.tobytes() == retest.tobytes() != a.tobytes()
    # identical wrong output on two devices would trip the circuit breaker: a fire drill must not look like that
    assert h1("c", a).tobytes() != first.tobytes()


def test_hook_case_glob_and_any_dtype():
    hook = golden_output_hook(parse_inject_spec("sim:0:bitflip,case=mem*"), sim_id(0))
    a = np.zeros(8, dtype=np.complex64)
    assert hook("gemm", a) is a
    out = hook("memtest_march", a)
    assert out.dtype == a.dtype and np.count_nonzero(out != a) == 1


_DEVICES = st.sampled_from(["all", "sim:0", "cpu:0", "cuda:1", sim_id(0), GPU, cpu_id(2)])


@st.composite
def _rule_texts(draw: st.DrawFn) -> str:
    """One valid rule as an operator writes it: any device, pattern and keys the grammar allows."""
    device = draw(_DEVICES)
    case = draw(st.none() | st.sampled_from(["gemm*", "alu.u32.*", "memory.*"]))
    if draw(st.booleans()) and draw(st.booleans()):  # a quarter slow drills
        text = f"{device}:slow,factor={draw(st.floats(1.01, 100.0))!r}"
        return text + (f",case={case}" if case else "")
    pattern = draw(st.sampled_from(PATTERNS))
    timing = draw(st.sampled_from(TIMINGS))
    parts = [f"{device}:{pattern}", f"timing={timing}", f"seed={draw(st.integers(0, 2**40))}"]
    if timing != "sticky":
        parts.append(f"rate={draw(st.floats(0.0, 1.0))!r}")
    if pattern in ("bitflip", "stuck0", "stuck1"):
        parts.append(f"bit={draw(st.integers(0, 63) | st.sampled_from(BIT_CLASSES))}")
    elif pattern == "multibit":
        parts.append(f"bits={draw(st.integers(2, 8))}")
    if draw(st.booleans()):
        parts.append(f"elements={draw(st.integers(1, 64))},period={draw(st.integers(0, 64))}")
    if draw(st.booleans()):
        lo = draw(st.floats(-1e30, 1e30))
        parts.append(f"range={lo!r}..{draw(st.sampled_from([repr(lo + abs(lo) + 1.0), 'inf']))}")
    if case:
        parts.append(f"case={case}")
    return ",".join(parts)


@given(st.lists(_rule_texts(), min_size=1, max_size=3))
def test_a_parsed_spec_crosses_a_process_boundary_as_itself(rules: list[str]) -> None:
    """What the scanner's parent parses is what every worker and retest gets back from JSON: the same rules, the
    same text, and a hook that corrupts the same bits (the drill is never parsed twice, so it cannot differ)."""
    spec = InjectSpec.parse(";".join(rules))
    back = InjectSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert back == spec and back.text == spec.text and [r.text for r in back.rules] == [r.text for r in spec.rules]
    for device, cuda_index in ((sim_id(0), None), (cpu_id(0), None), (GPU, 1)):
        ours, theirs = spec.hook(device, cuda_index=cuda_index), back.hook(device, cuda_index=cuda_index)
        assert (ours is None) == (theirs is None)
        if ours is None or theirs is None:
            continue
        a = np.linspace(-4.0, 4.0, 256)  # float64: every bit position a rule may name
        for case in ("gemm.fp32.n256", "alu.u32.chain", "memory.u32.march"):
            assert ours.slowdown(case) == theirs.slowdown(case)
            assert ours(case, a).tobytes() == theirs(case, a).tobytes()
        assert ours.records == theirs.records


def test_rebuilding_a_spec_never_calls_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = InjectSpec.parse("cpu:0:bitflip,bit=low_mantissa;all:zero,rate=0.5,case=gemm*;cpu:1:slow,factor=3")
    data = json.loads(json.dumps(spec.to_json()))

    def refuse(text: str) -> list[object]:
        raise AssertionError(f"parsed {text!r} again")

    monkeypatch.setattr(spec_module, "parse_inject_spec", refuse)
    monkeypatch.setattr(spec_module, "parse_spec", refuse)
    assert InjectSpec.from_json(data) == spec
    with pytest.raises(AssertionError, match="parsed"):
        InjectSpec.parse("cpu:0:zero")  # the seam is the one the scanner goes through
