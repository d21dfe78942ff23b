"""Faults on torch tensors: the dispatch mode hits exactly the chosen op, and the torch path applies exactly the
numpy model's plan (one definition of every pattern)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from sdcguard.errors import BadInput
from sdcguard.inject import Fault, FaultModel, formats
from sdcguard.inject.torch_faults import OP_FAMILIES, OpFaultMode, corrupt_gradients_, corrupt_tensor_, corrupt_weights_

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> np.ndarray:
    """Raw bits of a tensor, flat in C order, as uint64 (NaN-safe equality)."""
    t = t.detach().contiguous()
    return t.view(_INT[t.element_size()]).reshape(-1).numpy().view(f"u{t.element_size()}").astype(np.uint64)


class Tap(TorchDispatchMode):
    """Records every aten op's outputs as the caller sees them (entered inside OpFaultMode: after corruption)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str, list]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
        saved = [o.detach().clone() if isinstance(o, torch.Tensor) else None for o in outs]
        self.log.append((func.overloadpacket.__name__, phase, saved))
        return out


class Tiny(torch.nn.Module):
    """Every op family in a few lines: embedding, matmul, activation, norm, attention/softmax, loss."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(11, 8)
        self.lin1 = torch.nn.Linear(8, 8)
        self.ln = torch.nn.LayerNorm(8)
        self.lin2 = torch.nn.Linear(8, 11)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.ln(F.gelu(self.lin1(self.emb(tokens))))
        a = F.scaled_dot_product_attention(h[None], h[None], h[None])[0]
        return F.cross_entropy(self.lin2(h + a), targets)


def _model() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


TOKENS = torch.tensor([1, 4, 2, 7, 9, 3])
TARGETS = torch.tensor([0, 3, 5, 10, 2, 1])


def _run(model: Tiny, mode: OpFaultMode | None, steps: int = 1) -> list[list]:
    """Forward + backward per step, under ``mode`` (if any); the tap log of each step."""
    logs = []
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        tap = Tap()
        if mode is not None:
            mode.step = step
            with mode, tap:
                model(TOKENS, TARGETS).backward()
        else:
            with tap:
                model(TOKENS, TARGETS).backward()
        logs.append(tap.log)
    return logs


def _first_divergence(clean: list, faulty: list) -> int | None:
    assert [(n, p) for n, p, _ in clean] == [(n, p) for n, p, _ in faulty]
    for i, ((_, _, a), (_, _, b)) in enumerate(zip(clean, faulty, strict=True)):
        for x, y in zip(a, b, strict=True):
            if x is not None and not np.array_equal(bits(x), bits(y)):
                return i
    return None


@pytest.mark.parametrize(
    ("family", "phase", "occurrence"),
    [
        ("matmul", "forward", 0),
        ("matmul", "forward", 2),
        ("matmul", "backward", 1),
        ("attention", "forward", 0),
        ("softmax", "backward", 0),
        ("norm", "forward", 0),
        ("norm", "backward", 0),
        ("activation", "forward", 0),
        ("activation", "backward", 0),
        ("embedding", "forward", 0),
        ("embedding", "backward", 0),
        ("loss", "forward", 1),
        ("loss", "backward", 0),
    ],
)
def test_op_mode_corrupts_exactly_the_chosen_op(family, phase, occurrence):
    (clean,) = _run(_model(), None)
    mode = OpFaultMode(Fault(pattern="bitflip", elements=3, seed=4), ops=family, phase=phase, occurrence=occurrence)
    (faulty,) = _run(_model(), mode)
    records = mode.records
    assert records, "the chosen op must be hit"
    assert all(r.occurrence == occurrence and r.phase == phase and r.rank == 0 for r in records)
    # which call is the chosen one: the occurrence-th call of the family in that phase
    calls = [i for i, (n, p, _) in enumerate(clean) if n in OP_FAMILIES[family] and p == phase]
    target = calls[occurrence]
    assert _first_divergence(clean, faulty) == target, "everything before the chosen op is untouched"
    name, _, outs = faulty[target]
    assert {r.target for r in records} == {f"aten.{name}"}
    before, after = bits(clean[target][2][0]), bits(outs[0])
    assert np.flatnonzero(before != after).tolist() == sorted(r.index for r in records)
    for r in records:
        assert (r.before, r.after) == (before[r.index], after[r.index])
        assert r.shape == tuple(outs[0].shape)
    for x, y in zip(clean[target][2][1:], outs[1:], strict=True):  # other outputs of the op untouched
        if x is not None:
            assert np.array_equal(bits(x), bits(y))


def test_op_mode_on_another_rank_changes_nothing():
    (clean,) = _run(_model(), None)
    mode = OpFaultMode(Fault(pattern="zero"), ops=list(OP_FAMILIES), rank=1)
    (faulty,) = _run(_model(), mode)
    assert mode.records == [] and mode.model.calls == 0
    assert _first_divergence(clean, faulty) is None


def test_op_mode_only_at_the_chosen_steps():
    clean = _run(_model(), None, steps=4)
    mode = OpFaultMode(Fault(pattern="bitflip"), ops="mm", steps=[2], occurrence=0)
    faulty = _run(_model(), mode, steps=4)
    assert {r.step for r in mode.records} == {2} and len(mode.records) == 1
    assert [_first_divergence(c, f) is None for c, f in zip(clean, faulty, strict=True)] == [True, True, False, True]


def test_op_mode_needs_the_step_when_steps_are_given():
    mode = OpFaultMode(Fault(pattern="zero"), ops="matmul", steps=[0])
    model = _model()
    with mode:
        model(TOKENS, TARGETS)
    assert mode.records == []


def test_op_mode_timings_apply_per_matching_call():
    n_mm = sum(1 for n, p, _ in _run(_model(), None)[0] if n in OP_FAMILIES["matmul"])
    sticky = OpFaultMode(Fault(pattern="bitflip"), ops="matmul")
    _run(_model(), sticky, steps=3)
    assert len(sticky.records) == 3 * n_mm and sticky.model.calls == 3 * n_mm
    transient = OpFaultMode(Fault(pattern="bitflip", timing="transient"), ops="matmul")
    _run(_model(), transient, steps=3)
    assert len(transient.records) == 1 and transient.records[0].step == 0 and transient.records[0].occurrence == 0


def test_op_mode_rejects_bad_arguments():
    with pytest.raises(BadInput, match="unknown op"):
        OpFaultMode(Fault(), ops="matmull")
    with pytest.raises(BadInput, match="phase"):
        OpFaultMode(Fault(), phase="sideways")
    assert "mm" in OpFaultMode(Fault(), ops=["aten.mm", "gelu"]).ops


TORCH_DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
]
faults = st.builds(
    Fault,
    pattern=st.sampled_from(["bitflip", "multibit", "zero", "stuck0", "stuck1", "mix"]),
    elements=st.integers(1, 10),
    period=st.sampled_from([None, 0, 4]),
    control=st.sampled_from([None, 0.0, 0.5]),
    tile=st.sampled_from([8, 1024]),
    value_range=st.sampled_from([None, (-1.0, 1.0), (0.0, 1e30)]),
    seed=st.integers(0, 2**40),
)


@given(
    st.sampled_from(TORCH_DTYPES), st.integers(1, 40), st.integers(1, 6), st.booleans(), faults, st.integers(0, 2**32)
)
@settings(max_examples=100)
def test_torch_applies_exactly_the_numpy_plan(dtype, rows, cols, transpose, fault, seed):
    """The same fault on the same bits gives the same result through torch (any strides) as through numpy."""
    width = torch.empty(0, dtype=dtype).element_size()
    g = np.random.default_rng(seed)
    raw = g.integers(0, 2 ** (8 * width), size=(rows, cols), dtype=np.uint64).astype(f"u{width}")
    t = torch.from_numpy(raw.view(f"i{width}") if width > 1 else raw).view(dtype)
    if transpose:
        t = t.t()  # non-contiguous: flat indices are still C order of the logical shape
    name = str(dtype).removeprefix("torch.")
    expected, np_records = FaultModel(fault).corrupt_array(bits(t).astype(f"u{width}").reshape(t.shape), dtype=name)
    records = corrupt_tensor_(t, FaultModel(fault), target="x")
    assert [(r.index, r.before, r.after, r.effect, r.control) for r in records] == [
        (r.index, r.before, r.after, r.effect, r.control) for r in np_records
    ]
    assert np.array_equal(bits(t), expected.reshape(-1).astype(np.uint64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float16])
def test_decode_agrees_with_torch(dtype):
    fmt = formats.get(str(dtype))
    codes = np.arange(2**fmt.width, dtype=np.uint64).astype(fmt.uint)
    raw = torch.from_numpy(codes.view(f"i{fmt.width // 8}") if fmt.width > 8 else codes)
    np.testing.assert_array_equal(fmt.decode(codes), raw.view(dtype).to(torch.float64).numpy())


def _grads(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {n: bits(p.grad) for n, p in model.named_parameters()}


def test_gradients_change_exactly_where_recorded():
    model = _model()
    model(TOKENS, TARGETS).backward()
    clean = _grads(model)
    records = corrupt_gradients_(model, Fault(pattern="mix", elements=20, period=0, seed=2), names="lin*", step=7)
    assert records and all(r.target.startswith("grad:lin") and r.step == 7 for r in records)
    after = _grads(model)
    for name in clean:
        hit = sorted(r.index for r in records if r.target == f"grad:{name}" and r.changed)
        assert np.flatnonzero(clean[name] != after[name]).tolist() == hit
    for r in records:
        assert (r.before, r.after) == (clean[r.target[5:]][r.index], after[r.target[5:]][r.index])


def test_gradients_on_another_rank_are_untouched():
    model = _model()
    model(TOKENS, TARGETS).backward()
    clean = _grads(model)
    fm = FaultModel(Fault(pattern="zero"))
    assert corrupt_gradients_(model, fm, rank=1) == [] and fm.calls == 0
    assert all(np.array_equal(clean[n], g) for n, g in _grads(model).items())
    with pytest.raises(BadInput, match="after backward"):
        corrupt_gradients_(_model(), Fault())


def test_weights_change_exactly_where_recorded():
    model = _model()
    clean = {n: bits(p) for n, p in model.named_parameters()}
    records = corrupt_weights_(
        model, Fault(pattern="stuck1", bit="exponent", elements=6, period=0, seed=1), names="emb.weight"
    )
    assert records and {r.target for r in records} == {"weight:emb.weight"}
    for n, p in model.named_parameters():
        hit = sorted(r.index for r in records if r.target == f"weight:{n}" and r.changed)
        assert np.flatnonzero(clean[n] != bits(p)).tolist() == hit
    assert not model.emb.weight.grad  # no autograd history was created


def test_value_range_on_tensors():
    t = torch.tensor([-5.0, 0.5, 3.0, 0.25, 9.0])
    records = corrupt_tensor_(t, Fault(pattern="zero", elements=5, value_range=(0.0, 1.0)))
    assert sorted(r.index for r in records) == [1, 3]
    assert t.tolist() == [-5.0, 0.0, 3.0, 0.0, 9.0]


def test_public_names_load_lazily():
    import sdcguard
    import sdcguard.inject

    assert sdcguard.OpFaultMode is OpFaultMode
    assert sdcguard.inject.corrupt_gradients_ is corrupt_gradients_


def test_read_bits_may_return_signed_integers():
    """A caller reading through a signed view (torch has no uint16/32 indexing everywhere) gets the right bits."""
    model = FaultModel(Fault(pattern="bitflip", bit=0))
    (r,) = model.plan(4, "bfloat16", read_bits=lambda idx: np.full(idx.size, -2, dtype=np.int16))
    assert (r.before, r.after) == (0xFFFE, 0xFFFF)
