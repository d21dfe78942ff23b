"""Non-finite values in one process: a NaN loss is vetoed and reported; a ``GradScaler``'s overflowing step (infinite
gradients on purpose, seeded by the scaled loss) is left to the scaler, which skips it itself, with no incident and
no veto that would break ``scaler.step``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sdcguard import SDCGuard


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    with torch.autocast("cpu", dtype=torch.float16):  # float16 activations: a scaled backward overflows in them
        return F.cross_entropy(model(x).float(), y)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def test_a_loss_scalers_overflow_is_its_own_to_skip_and_a_nan_loss_is_vetoed() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**18, growth_interval=100)  # overflows until the scale fits
    guard = SDCGuard(model, _loss, replay_every=0, checksum_every=0)
    seen = []
    for step in range(10):
        x, y = _batch(step)
        if step == 9:
            x[0, 0] = float("nan")
        guard.begin_step(step)
        guard.before_forward((x, y))
        loss = _loss(model, (x, y))
        guard.observe_loss(loss)
        scaler.scale(loss).backward()
        report = guard.end_step()
        grads = [p.grad for p in model.parameters()]
        overflowed = all(g is not None for g in grads) and not all(bool(torch.isfinite(g).all()) for g in grads)
        before = [p.detach().clone() for p in model.parameters()]
        if report.commit:
            scaler.step(opt)
            scaler.update()
        changed = any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
        opt.zero_grad(set_to_none=True)
        guard.after_optimizer_step()
        seen.append((report.commit, [i.kind for i in report.incidents], overflowed, changed))
    overflows = [s for s in seen[:-1] if s[2]]
    assert overflows and all(s == (True, [], True, False) for s in overflows), seen  # no veto, skipped by the scaler
    fits = [s for s in seen[:-1] if not s[2]]
    assert fits and all(s == (True, [], False, True) for s in fits), seen  # a scale that fits: trained
    assert seen[-1][:2] == (False, ["nonfinite"]) and not seen[-1][3], seen  # a NaN loss: vetoed, reported
