"""What the checksum identity cannot see, built case by case, each shown to count 0 and each disclosed in
``docs/checksums.md`` (the page that says so, with the condition under which a NaN alarms): permutations inside a
block, compensating errors in one block column, columns not judged (a ``finfo.min`` causal mask added with
``baddbmm``, a NaN at an unmasked entry), and changes under the rounding bound. The same faults outside those
conditions are caught, so each case is a blind spot of the identity, not of the test."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sdcguard.training.checksums import check_matmul, precision_for

DOC = Path(__file__).resolve().parents[3] / "docs" / "checksums.md"
P = precision_for(torch.float32, torch.device("cpu"))


def _text() -> str:
    return " ".join(DOC.read_text(encoding="utf-8").split())


def _product(seed: int = 0, m: int = 64, k: int = 32, n: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    return a, b, a @ b


def _count(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None = None) -> int:
    assert P is not None
    return int(check_matmul(a, b, c, bias=bias, precision=P))


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("swap", "two rows of one block swapped"),
        ("reverse", "a block's rows reversed"),
        ("compensate", "two errors in one block column that cancel"),
    ],
)
def test_permutations_and_compensations_inside_a_block_are_invisible_and_disclosed(case: str, said: str) -> None:
    a, b, c = _product()
    bad = c.clone()
    if case == "swap":
        bad[[3, 17]] = bad[[17, 3]]
    elif case == "reverse":
        bad[32:64] = bad[32:64].flip(0)
    else:
        bad[3, 5] += 10.0
        bad[17, 5] -= 10.0
    assert not torch.equal(bad, c) and _count(a, b, bad) == 0
    assert said in _text()
    # across blocks the same change is caught: the blind spot is the block, not the size of the fault
    across = c.clone()
    if case == "compensate":
        across[3, 5] += 10.0
        across[40, 5] -= 10.0
    else:
        across[[3, 40]] = across[[40, 3]]
    assert _count(a, b, across) >= 1


def _causal_scores(masked: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention scores ``mask + q @ k^T`` as ``baddbmm`` computes them, with the causal mask finite (``finfo.min``,
    as transformers builds it) or without it."""
    g = torch.Generator().manual_seed(1)
    q, kt = torch.randn(2, 64, 16, generator=g), torch.randn(2, 16, 64, generator=g)
    mask = torch.zeros(64, 64)
    if masked:
        mask = mask.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    mask = mask.expand(2, 64, 64).contiguous()
    return q, kt, mask, torch.baddbmm(mask, q, kt)


def test_a_nan_at_an_unmasked_entry_of_a_finfo_min_masked_column_is_not_judged_and_disclosed() -> None:
    q, kt, mask, scores = _causal_scores(masked=True)
    bad = scores.clone()
    bad[0, 55, 50] = float("nan")  # row 55, column 50: unmasked (50 <= 55), its block column holds masked rows
    assert mask[0, 55, 50] == 0 and (mask[0, 32:64, 50] != 0).any()
    assert _count(q, kt, bad, bias=mask) == 0
    text = _text()
    assert "finfo.min" in text and "a NaN at an unmasked entry included, passes" in text
    # the NaN sentence says under which condition a NaN alarms
    assert (
        "A NaN or an Inf in a result alarms only in a judged block column: one whose operands (and added term) are "
        "finite and whose magnitudes stay below a quarter of the output's overflow threshold." in text
    )
    # the same NaN without the mask, or in a block column with no masked entry, is caught
    q, kt, zeros, clean = _causal_scores(masked=False)
    bad = clean.clone()
    bad[0, 55, 50] = float("nan")
    assert _count(q, kt, bad, bias=zeros) == 1
    q, kt, mask, scores = _causal_scores(masked=True)
    bad = scores.clone()
    bad[0, 63, 0] = float("nan")  # column 0 is masked in no row
    assert _count(q, kt, bad, bias=mask) == 1


def test_a_change_under_the_rounding_bound_passes_and_is_disclosed() -> None:
    a, b, c = _product()
    bad = c.clone()
    bad[5, 3] = torch.nextafter(bad[5, 3], torch.tensor(float("inf")))  # the lowest mantissa bit
    assert _count(a, b, bad) == 0
    assert "flips of the low mantissa bits" in _text()


def test_the_page_says_how_replay_covers_them_and_names_its_tests() -> None:
    text = _text()
    assert "How replay covers them." in text
    for name in ("test_blind_spots.py", "test_precision_settings.py", "test_checksum_bound.py"):
        assert name in text and (Path(__file__).parent / name).exists()
