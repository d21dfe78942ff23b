"""Fingerprints: the definition (against an independent pure-Python reference), the guarantees users rely on
(single flipped bits and swapped elements always change it; copies and strided views agree), and the backends
agreeing bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sdcguard.errors import BadInput, Unfingerprintable
from sdcguard.fingerprints import CHUNK_WORDS, fingerprint, fingerprint_many, signed64
from sdcguard.fingerprints.tensors import fingerprint_on_device

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------------------------------------
# An independent pure-Python implementation of the module docstring's definition.
# ------------------------------------------------------------------------------------------------------------
_M64 = (1 << 64) - 1
_PHI = 0x9E3779B97F4A7C15
_SEED = 0x5D6C9A2B3F17E4C1


def _mix(z: int) -> int:
    z &= _M64
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _ref_weights(salt: int) -> list[int]:
    m = 14
    out = []
    for i in range(1 << m):
        p = i // 2
        low = p if i % 2 == 0 else (1 << (m - 1)) + 3 * p
        r = _mix(i + salt * _PHI)
        out.append((2 * low + 1 + (r << (m + 3))) & 0xFFFFFFFF)
    return out


_REF_T = _ref_weights(1)
_REF_U = _ref_weights(2)


def reference_fingerprint(data: bytes) -> int:
    n = len(data)
    padded = data + b"\0" * (-n % 4)
    words = [int.from_bytes(padded[k : k + 4], "little", signed=True) for k in range(0, len(padded), 4)]
    acc = 0
    for c in range(0, (len(words) + CHUNK_WORDS - 1) // CHUNK_WORDS):
        chunk = words[c * CHUNK_WORDS : (c + 1) * CHUNK_WORDS]
        sa = sum(w * t for w, t in zip(chunk, _REF_T)) % (1 << 32)
        sb = sum((w >> 16) * u for w, u in zip(chunk, _REF_U)) % (1 << 32)
        acc += _mix(sa + (sb << 32) + c * _PHI + _SEED)
    return _mix(acc + _mix(n + _PHI))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 64, 4 * CHUNK_WORDS - 1, 4 * CHUNK_WORDS, 4 * CHUNK_WORDS + 3])
def test_matches_the_documented_definition(n: int) -> None:
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    expected = reference_fingerprint(data.tobytes())
    assert fingerprint(data) == expected
    assert fingerprint(torch.from_numpy(data.copy())) == expected
    assert int(fingerprint_on_device(torch.from_numpy(data.copy()), torch_ops=True).item()) & _M64 == expected


# ------------------------------------------------------------------------------------------------------------
# Properties, for every dtype family.
# ------------------------------------------------------------------------------------------------------------
DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


@st.composite
def raw_tensors(draw: st.DrawFn, max_elems: int = 300) -> tuple[np.ndarray, torch.dtype]:
    """Random raw bytes for a random dtype: ``(bytes as a uint8 array, dtype)``."""
    dtype = draw(st.sampled_from(DTYPES))
    esize = torch.empty(0, dtype=dtype).element_size()
    n = draw(st.integers(1, max_elems))
    seed = draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(0, 256, n * esize, dtype=np.uint8)
    if dtype == torch.bool:
        raw &= 1  # only 0/1 are bools
    if draw(st.booleans()):  # low-entropy data: many equal elements, the hard case for swaps
        raw &= draw(st.sampled_from([0x01, 0x80, 0xF0]))
    return raw, dtype


def _as_tensor(raw: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(raw.copy()).view(dtype)


@given(raw_tensors(), st.data())
def test_any_single_flipped_bit_changes_the_fingerprint(
    case: tuple[np.ndarray, torch.dtype], data: st.DataObject
) -> None:
    raw, dtype = case
    x = _as_tensor(raw, dtype)
    bit = data.draw(st.integers(0, raw.size * 8 - 1))
    y = x.clone()
    y.view(torch.uint8)[bit // 8] ^= 1 << (bit % 8)
    assert fingerprint(y) != fingerprint(x)
    flipped = raw.copy()
    flipped[bit // 8] ^= 1 << (bit % 8)
    assert fingerprint(flipped) == fingerprint(y)


@given(raw_tensors(), st.data())
def test_swapping_two_unequal_elements_changes_the_fingerprint(
    case: tuple[np.ndarray, torch.dtype], data: st.DataObject
) -> None:
    raw, dtype = case
    x = _as_tensor(raw, dtype)
    assume(x.numel() >= 2)
    i = data.draw(st.integers(0, x.numel() - 1))
    j = data.draw(st.integers(0, x.numel() - 1))
    esize = x.element_size()
    bi, bj = raw[i * esize : (i + 1) * esize], raw[j * esize : (j + 1) * esize]
    assume(i != j and bi.tobytes() != bj.tobytes())
    y = x.clone()
    y[i], y[j] = x[j].clone(), x[i].clone()
    assert fingerprint(y) != fingerprint(x)


@given(raw_tensors())
def test_a_copy_agrees_and_torch_equals_numpy(case: tuple[np.ndarray, torch.dtype]) -> None:
    raw, dtype = case
    x = _as_tensor(raw, dtype)
    f = fingerprint(x)
    assert fingerprint(x.clone()) == f
    assert fingerprint(raw) == f
    assert int(fingerprint_on_device(x, torch_ops=True).item()) & _M64 == f


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(DTYPES), st.lists(st.integers(1, 9), min_size=1, max_size=4), st.data())
def test_a_strided_view_agrees_with_its_contiguous_copy(
    dtype: torch.dtype, shape: list[int], data: st.DataObject
) -> None:
    seed = data.draw(st.integers(0, 2**32 - 1))
    nbytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    base = _as_tensor(
        np.random.default_rng(seed).integers(0, 2 if dtype == torch.bool else 256, nbytes, dtype=np.uint8), dtype
    ).reshape(shape)
    view = base
    for d in range(view.dim()):
        step = data.draw(st.integers(1, 3))
        start = data.draw(st.integers(0, view.shape[d] - 1))
        view = view.narrow(d, start, view.shape[d] - start)[(slice(None),) * d + (slice(None, None, step),)]
    if view.dim() >= 2 and data.draw(st.booleans()):
        view = view.transpose(0, -1)
    f = fingerprint(view)
    assert f == fingerprint(view.contiguous())
    assert f == int(fingerprint_on_device(view, torch_ops=True).item()) & _M64
    if dtype not in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        assert f == fingerprint(view.numpy())  # numpy's own strided path


# ------------------------------------------------------------------------------------------------------------
# Beyond one block (1 MiB): staging, chunk boundaries, several chunks.
# ------------------------------------------------------------------------------------------------------------


def test_large_non_contiguous_and_misaligned_inputs_agree_with_contiguous_copies() -> None:
    x = torch.randn(3, 700, 300)  # 2.5 MB
    for view in (x[:, :, ::2], x.transpose(0, 2), x[1:, 3:]):
        assert fingerprint(view) == fingerprint(view.contiguous()) == fingerprint(view.numpy())
    b = torch.randint(0, 256, (3 * (1 << 20) + 5,), dtype=torch.uint8)
    assert fingerprint(b[1:]) == fingerprint(b[1:].clone()) == fingerprint(b[1:].numpy())
    assert int(fingerprint_on_device(b[1:], torch_ops=True).item()) & _M64 == fingerprint(b[1:].clone())


def test_flips_at_chunk_and_block_boundaries_and_whole_chunk_swaps_are_seen() -> None:
    x = torch.randint(-(2**31), 2**31 - 1, (3 * CHUNK_WORDS * 16 + 11,), dtype=torch.int32)
    f = fingerprint(x)
    for i in (0, CHUNK_WORDS - 1, CHUNK_WORDS, 16 * CHUNK_WORDS - 1, 16 * CHUNK_WORDS, x.numel() - 1):
        for bit in (0, 15, 16, 31):
            y = x.clone()
            y[i] ^= 1 << bit if bit < 31 else -(2**31)
            assert fingerprint(y) != f, (i, bit)
    y = x.clone()
    first, second = x[:CHUNK_WORDS].clone(), x[CHUNK_WORDS : 2 * CHUNK_WORDS].clone()
    y[:CHUNK_WORDS], y[CHUNK_WORDS : 2 * CHUNK_WORDS] = second, first
    assert fingerprint(y) != f
    # the sign-bit swap a linear 32-bit sum cannot see: x and -x
    z = torch.ones(1000)
    z[10] = -1.0
    w = z.clone()
    w[10], w[13] = 1.0, -1.0
    assert fingerprint(z) != fingerprint(w)


def test_length_is_part_of_the_fingerprint_and_empty_inputs_agree() -> None:
    assert fingerprint(np.array([1, 2, 3], np.uint8)) != fingerprint(np.array([1, 2, 3, 0], np.uint8))
    assert fingerprint(torch.zeros(0)) == fingerprint(np.zeros((0, 3), np.int8)) == fingerprint(torch.zeros(2, 0))
    assert fingerprint(torch.tensor(1.0)) == fingerprint(np.float32(1.0)) == fingerprint(torch.ones(1))


def test_different_lengths_are_not_separated_with_certainty() -> None:
    """The documented counterexample: what is proven about lengths is only the zero-extension below."""
    twelve = np.array([0x3E342598, 0x5BBC23ED, 0xEFFD214C], dtype=np.uint32)
    sixteen = np.zeros(16, dtype=np.uint8)
    assert fingerprint(twelve) == fingerprint(sixteen) == reference_fingerprint(sixteen.tobytes()) == 0x83F43075BF573200
    assert fingerprint(torch.from_numpy(twelve.view(np.int32))) == fingerprint(torch.zeros(4))


@given(st.binary(min_size=1, max_size=600), st.integers(1, 64), st.booleans())
def test_appending_zero_bytes_inside_the_last_chunk_always_changes_the_fingerprint(
    data: bytes, extra: int, near_boundary: bool
) -> None:
    if near_boundary:  # end close to a chunk boundary (the appended zeros must stay inside the last chunk)
        data = bytes(4 * CHUNK_WORDS - extra - len(data) % 7) + data[: len(data) % 7]
    chunks = lambda n: -(-n // (4 * CHUNK_WORDS))  # noqa: E731
    assume(chunks(len(data)) == chunks(len(data) + extra))
    a = np.frombuffer(data, dtype=np.uint8)
    b = np.frombuffer(data + bytes(extra), dtype=np.uint8)
    assert fingerprint(a) != fingerprint(b)


@given(raw_tensors(), st.data())
def test_any_two_flipped_bits_within_a_chunk_change_the_fingerprint(
    case: tuple[np.ndarray, torch.dtype], data: st.DataObject
) -> None:
    raw, _ = case
    nbits = raw.size * 8
    a = data.draw(st.integers(0, nbits - 1))
    # the hard case the proof covers separately: the same bit position in two different words
    same_position = data.draw(st.booleans()) and raw.size >= 8
    if same_position:
        word = data.draw(st.integers(0, raw.size // 4 - 1))
        b = (word * 32 + a % 32) if word * 32 + a % 32 != a else ((word + 1) % (raw.size // 4)) * 32 + a % 32
    else:
        b = data.draw(st.integers(0, nbits - 1))
    assume(a != b)
    flipped = raw.copy()
    for bit in (a, b):
        flipped[bit // 8] ^= 1 << (bit % 8)
    assert fingerprint(flipped) != fingerprint(raw)


def test_fingerprint_many_equals_one_by_one() -> None:
    xs = [
        torch.randn(5, 7),
        np.arange(9, dtype=np.int16),
        torch.randn(4, 4).t(),
        torch.zeros(0),
        torch.ones(3, dtype=torch.bfloat16),
    ]
    assert fingerprint_many(xs) == [fingerprint(x) for x in xs]
    assert fingerprint_many([]) == []


def test_unsupported_inputs_raise_a_clear_type_error() -> None:
    with pytest.raises(Unfingerprintable, match="expected a torch tensor"):
        fingerprint([1, 2, 3])
    with pytest.raises(Unfingerprintable, match="strided"):
        fingerprint(torch.eye(3).to_sparse())
    with pytest.raises(Unfingerprintable, match="object arrays"):
        fingerprint(np.array([object()]))
    # a tensor subclass without data of its own (it used to reach the C engine: a segmentation fault)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.ones(4)
    with pytest.raises(Unfingerprintable, match="tensor subclass without data"):
        fingerprint(fake)
    assert issubclass(Unfingerprintable, BadInput) and issubclass(Unfingerprintable, TypeError)


def _dtensor_rank(rank: int, world: int) -> dict[str, object]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from sdcguard.fingerprints import fingerprints_on_device

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    whole = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    sharded = distribute_tensor(whole, mesh, [Shard(0)])
    replicated = distribute_tensor(whole, mesh, [Replicate()])
    return {
        "shard": fingerprint(sharded) == fingerprint(sharded.to_local()) == fingerprint(whole[rank * 3 : rank * 3 + 3]),
        "replicate": fingerprint(replicated) == fingerprint(whole),
        "on_device": int(fingerprints_on_device([sharded])[0]) == signed64(fingerprint(sharded.to_local())),
    }


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_dtensor_is_fingerprinted_by_its_local_shard() -> None:
    from sdcguard.testing import run_ranks

    assert run_ranks(_dtensor_rank, 2, timeout=100) == [{"shard": True, "replicate": True, "on_device": True}] * 2


def test_the_numpy_path_never_imports_torch() -> None:
    code = (
        "import sys, numpy as np, sdcguard\n"
        "f = sdcguard.fingerprint(np.arange(100000, dtype=np.float32)[::3])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "print(f)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == fingerprint(np.arange(100000, dtype=np.float32)[::3])


@pytest.mark.gpu
def test_cupy_and_cuda_tensors_agree_with_the_host() -> None:
    import cupy

    host = np.random.default_rng(1).integers(0, 256, 5 * (1 << 20) + 3, dtype=np.uint8)
    dev = cupy.asarray(host)
    assert fingerprint(dev) == fingerprint(host)
    assert fingerprint(dev[1::3]) == fingerprint(host[1::3])
    if torch.cuda.is_available():
        t = torch.from_numpy(host).cuda()
        assert fingerprint(t) == fingerprint(host)
        assert fingerprint(t[1::3]) == fingerprint(host[1::3])
        v = torch.randn(300, 301, device="cuda").t()
        assert fingerprint(v) == fingerprint(v.cpu().contiguous())


def test_the_cuda_kernel_compiles_with_nvrtc() -> None:
    """The fused GPU kernel cannot run here, but it must compile (NVRTC needs no GPU), through the kernel loader
    that runs it, for the oldest architecture it supports (the golden kernels' test covers compute_80 and 90)."""
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    from sdcguard.fingerprints.cuda import KERNEL
    from sdcguard.kernels import compile_ptx

    try:
        cupy.cuda.nvrtc.getVersion()
    except Exception as e:  # the NVRTC library itself is missing
        pytest.skip(f"NVRTC unavailable: {e}")
    assert ".entry sdcguard_chunk_sums(" in compile_ptx(KERNEL, "compute_70")


def test_parameters_and_lazy_views_fingerprint_their_values() -> None:
    w = torch.nn.Linear(3, 5).weight  # requires grad
    assert fingerprint(w) == fingerprint(w.detach().clone())
    assert fingerprint(w.t()) == fingerprint(w.detach().t().contiguous())
    z = torch.randn(6, dtype=torch.complex64)
    assert fingerprint(z.conj()) == fingerprint(z.conj().resolve_conj())  # the conjugate's bits, not z's
    assert fingerprint(z.conj()) != fingerprint(z)


@given(st.binary(min_size=0, max_size=3 * 4 * (1 << 14) + 7))
def test_c_inner_loop_and_numpy_loops_agree(data: bytes) -> None:
    """The optional C loop (sdcguard._fpcore) and the numpy loops compute the same definition."""
    from sdcguard.fingerprints.cpu import c_engine_built, numpy_loops

    if not c_engine_built():
        pytest.skip("sdcguard._fpcore was not built (no C compiler at install time): numpy loops only")
    a = np.frombuffer(data, dtype=np.uint8)
    with_c = fingerprint(a)
    with numpy_loops():
        assert fingerprint(a) == with_c


def test_large_inputs_split_across_threads_agree_with_every_other_path() -> None:
    """Inputs beyond one 4 MiB run are cut into runs that threads share: every split, the numpy loops and the
    torch-op path give the same value, aligned or not, alone or batched with small tensors."""
    from sdcguard.fingerprints.cpu import numpy_loops

    b = torch.randint(0, 256, (9 * (1 << 20) + 6,), dtype=torch.uint8)
    for x in (b, b[1:], b[3:-1]):
        expected = int(fingerprint_on_device(x, torch_ops=True).item()) & _M64
        assert fingerprint(x) == expected == fingerprint(x.numpy())
        with numpy_loops():
            assert fingerprint(x) == expected
    small = [torch.randn(n) for n in (1, 7, 100, 3000)]
    xs = [*small, b[1:], torch.randn(3, 5).t(), *small]
    assert fingerprint_many(xs) == [fingerprint(x) for x in xs]


def test_sdcguard_fingerprint_stays_the_function_once_the_training_side_is_loaded() -> None:
    """The public name and the module that defines it must not shadow each other (the module is
    ``sdcguard.fingerprints``): the guard imports it, and ``sdcguard.fingerprint(x)`` must still be the function."""
    import sdcguard
    import sdcguard.training.guard  # noqa: F401  (imports the fingerprint engine)

    x = np.arange(10, dtype=np.float32)
    assert callable(sdcguard.fingerprint) and sdcguard.fingerprint(x) == sdcguard.fingerprint_many([x])[0]


# ------------------------------------------------------------------------------------------------------------
# Copying and fingerprinting in one pass (the asynchronous checkpoint's staging copy).
# ------------------------------------------------------------------------------------------------------------


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(raw_tensors(max_elems=3 * CHUNK_WORDS + 5), st.integers(0, 3), st.booleans(), st.booleans())
def test_copy_and_fingerprint_copies_exactly_and_returns_the_sources_fingerprints(
    case: tuple[np.ndarray, torch.dtype], offset: int, strided: bool, numpy_loops_only: bool
) -> None:
    """Any dtype and length (chunk boundaries, partial last words), misaligned sources, strided sources, with the C
    engine and with numpy's loops: the destination holds the source's bytes and the values are fingerprint's."""
    from sdcguard.fingerprints import copy_and_fingerprint
    from sdcguard.fingerprints.cpu import numpy_loops

    raw, dtype = case
    esize = torch.empty(0, dtype=dtype).element_size()
    base = _as_tensor(np.concatenate([np.zeros(offset * esize, np.uint8), raw]), dtype)
    src = base[offset:]  # a view starting `offset` elements in: misaligned for the engine's words
    if strided and src.numel() >= 2:
        src = src[::2]
    srcs = [src, torch.tensor(7, dtype=torch.int16), torch.empty(0)]
    dsts = [torch.full(s.shape, 0, dtype=s.dtype) for s in srcs]
    if numpy_loops_only:
        with numpy_loops():
            got = copy_and_fingerprint(srcs, dsts)
    else:
        got = copy_and_fingerprint(srcs, dsts)
    assert got == fingerprint_many(srcs)
    assert all(
        torch.equal(d.reshape(-1).view(torch.uint8), torch.empty_like(d).copy_(s).reshape(-1).view(torch.uint8))
        for s, d in zip(srcs, dsts)
    )  # bit for bit (NaNs included)


def test_copy_and_fingerprint_of_large_inputs_split_across_threads_and_numpy_arrays() -> None:
    from sdcguard.fingerprints import copy_and_fingerprint

    b = torch.randint(0, 256, (9 * (1 << 20) + 6,), dtype=torch.uint8)
    srcs: list[object] = [b[1:], torch.randn(3, 700, 300), np.arange(1001, dtype=np.int16), torch.randn(3, 5).t()]
    dsts: list[object] = [
        torch.empty_like(b[1:]),
        torch.empty(3, 700, 300),
        np.empty(1001, np.int16),
        torch.empty(5, 3),
    ]
    assert copy_and_fingerprint(srcs, dsts) == fingerprint_many(srcs)
    assert torch.equal(dsts[0], b[1:]) and np.array_equal(dsts[2], srcs[2]) and torch.equal(dsts[3], srcs[3])


def test_copy_and_fingerprint_refuses_what_it_cannot_copy_into() -> None:
    from sdcguard.fingerprints import copy_and_fingerprint

    x = torch.randn(4, 4)
    with pytest.raises(ValueError, match="C-contiguous"):
        copy_and_fingerprint([x], [torch.empty(4, 4).t()])
    with pytest.raises(ValueError, match="C-contiguous"):
        copy_and_fingerprint([x], [torch.empty(15)])
    with pytest.raises(ValueError, match="1 sources but 2"):
        copy_and_fingerprint([x], [x, x])
    with pytest.raises(TypeError, match="has no data"):
        copy_and_fingerprint([x.to("meta")], [x])
    if torch.cuda.is_available():
        with pytest.raises(TypeError, match="host memory only"):
            copy_and_fingerprint([x.cuda()], [x])
    with pytest.raises(TypeError, match="expected numpy arrays"):
        copy_and_fingerprint([[1.0]], [x])


def _sign_flipped(raw: np.ndarray, dtype: torch.dtype, *, conj: bool, neg: bool) -> torch.Tensor:
    """The documented bits of a lazy conjugate or negation: the sign bits XORed, nothing else touched."""
    t = torch.from_numpy(raw.copy()).view(dtype)
    words = torch.view_as_real(t) if dtype.is_complex else t
    ints = words.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[words.element_size()])
    sign = torch.iinfo(ints.dtype).min
    if neg:
        ints.bitwise_xor_(sign)
    if conj:
        ints[..., 1].bitwise_xor_(sign)
    return t


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from([torch.complex64, torch.complex128, torch.float32, torch.float16, torch.bfloat16]),
    n=st.integers(1, 3 * CHUNK_WORDS),
    seed=st.integers(0, 2**32 - 1),
    neg=st.booleans(),
)
def test_lazy_conjugates_and_negations_flip_sign_bits_alone_nans_included(
    dtype: torch.dtype, n: int, seed: int, neg: bool
) -> None:
    """Every bit pattern (a quarter of random complex numbers hold a NaN part): a lazy view's fingerprint is the
    fingerprint of the same bits with the sign bits XORed, on the CPU engine and the torch-op path (the one CUDA
    takes). The H200 run of 2026-12-04 found CUDA's ``resolve_conj`` rewriting NaN bits."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = np.random.default_rng(seed).integers(0, 256, n * itemsize, dtype=np.uint8)
    x = torch.from_numpy(raw.copy()).view(dtype)
    conj = dtype.is_complex
    view = x.conj() if conj else x
    if neg:
        view = torch._neg_view(view)
    want = fingerprint(_sign_flipped(raw, dtype, conj=conj, neg=neg).view(torch.uint8).numpy())
    assert fingerprint(view) == want
    assert int(fingerprint_on_device(view, torch_ops=True)) == signed64(want)


@pytest.mark.gpu
def test_a_lazy_conjugate_on_cuda_fingerprints_as_on_the_host() -> None:
    raw = np.random.default_rng(7).integers(0, 256, 8 * 20000, dtype=np.uint8)  # NaN parts among them
    host = torch.from_numpy(raw).view(torch.complex64).conj()
    assert fingerprint(host.cuda()) == fingerprint(host)
    assert fingerprint(host.cuda().conj().imag) == fingerprint(host.conj().imag)
