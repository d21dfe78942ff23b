"""What users run instead of sdcguard, watching the same steps: Megatron-LM's shipped checks and same-device replay.

**Megatron-LM, every check it ships turned on** (``NVIDIA/Megatron-LM``, read at commit d98e8a6):

- ``--check-for-nan-in-loss-and-grad`` (on by default): ``validate_result(loss, torch.isnan)`` and ``torch.isinf``
  on the rank's local loss (``pretrain_gpt.py``), and on the L2 norm of each DDP bucket's local gradients before
  the data-parallel collective (``param_and_grad_buffer.py``, ``check_grads``);
- ``--check-for-spiky-loss``: ``is_unexpectedly_large(loss, threshold=10, context="loss")``;
- ``--check-for-large-grads``: ``is_unexpectedly_large(bucket_norm, threshold=10, context="grads")`` on each
  bucket's local gradient norm (one shared context for all buckets);
- ``--check-weight-hash-across-dp-replicas-interval N`` (default None: off): after the optimizer step of every
  iteration divisible by N, ``check_param_hashes_across_dp_replicas(model, cross_check=True)``: a sha1 of every
  parameter (copied to the host, as float32) all-gathered over the data-parallel group; the job stops when any two
  differ, and every rank whose hashes differ from DP rank 0's logs the parameter.

``is_unexpectedly_large`` keeps the largest absolute value of the first 100 calls per context (never firing
then) and fires on a value at least 10x that maximum; NaN and Inf are ignored there. No result is validated on the
first iteration. A check that fires names the rank it fired on (``validate_result`` logs its rank); the weight
hash names the ranks that differ from rank 0.

**Same-device replay** (the torchtitan-style check): every step, the whole step (forward, backward, the DDP
reduction) runs again on the same device with the same batch, weights and random state, and its loss, each
bucket's local gradients and the reduced gradients are compared bit for bit with the original. Suspects: the ranks
whose local result differs, else the ranks whose reduced gradients differ.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

__all__ = ["BucketTap", "MegatronChecks", "param_hash_mismatch", "bits_equal", "rerun_step", "SameDeviceResult"]

LOSS_CHECKS = ("nan_loss", "inf_loss", "spiky_loss")
GRAD_CHECKS = ("nan_grad", "inf_grad", "large_grad")


class BucketTap:
    """A DDP communication hook that keeps each bucket's local gradients (what Megatron's bucket checks read, and
    what same-device replay compares), then hands the bucket to ``inner``: DDP's all-reduce, or a
    :class:`~sdcguard.inject.torch_faults.CorruptingCommHook` for a faulty collective."""

    def __init__(self) -> None:
        self.inner: Callable[..., Any] = allreduce_hook
        self.keep = False
        self.local: dict[int, torch.Tensor] = {}
        # DDP reads a hook's __name__ and __qualname__, as if it were a function
        self.__name__ = self.__qualname__ = "BucketTap"

    def __call__(self, state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        if self.keep:
            self.local[bucket.index()] = bucket.buffer().detach().clone()
        return self.inner(state, bucket)

    def take(self) -> list[torch.Tensor]:
        """The kept buckets, in bucket order; stops keeping."""
        out = [self.local[i] for i in sorted(self.local)]
        self.local, self.keep = {}, False
        return out


BucketTap.__call__.__annotations__.update({"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]})


class MegatronChecks:
    """Megatron-LM's per-step checks on one rank (see the module docstring)."""

    def __init__(self, *, threshold: float = 10.0, num_samples: int = 100) -> None:
        self.threshold = threshold
        self.num_samples = num_samples
        self.counts: dict[str, int] = {}
        self.max_values: dict[str, float] = {}
        self.first_iteration_complete = False

    def is_unexpectedly_large(self, value: float, context: str) -> bool:
        value = math.fabs(value)
        if math.isnan(value) or math.isinf(value):
            return False
        n = self.counts.get(context, 0)
        if n < self.num_samples:
            self.counts[context] = n + 1
            self.max_values[context] = max(self.max_values.get(context, 0.0), value)
            return False
        return value >= self.max_values[context] * self.threshold

    def check(self, loss: float, bucket_norms: Sequence[float]) -> list[str]:
        """The checks that fire on this rank for one iteration (its local loss, each bucket's local grad norm)."""
        if not self.first_iteration_complete:  # validate_result skips the first iteration
            self.first_iteration_complete = True
            return []
        fired = []
        if math.isnan(loss):
            fired.append("nan_loss")
        if math.isinf(loss):
            fired.append("inf_loss")
        if self.is_unexpectedly_large(loss, "loss"):
            fired.append("spiky_loss")
        for norm in bucket_norms:
            if math.isnan(norm):
                fired.append("nan_grad")
            if math.isinf(norm):
                fired.append("inf_grad")
            if self.is_unexpectedly_large(norm, "grads"):
                fired.append("large_grad")
        return sorted(set(fired))

    def state_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "max": dict(self.max_values), "first": self.first_iteration_complete}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts, self.max_values = dict(state["counts"]), dict(state["max"])
        self.first_iteration_complete = state["first"]


def bucket_norms(buckets: Sequence[torch.Tensor]) -> list[float]:
    return [float(b.norm(p=2)) for b in buckets]


def param_hash_mismatch(module: torch.nn.Module, group: Any = None) -> list[int]:
    """``check_param_hashes_across_dp_replicas(cross_check=True)``: sha1 of every parameter on the host, gathered
    over the group. Returns the group ranks whose hashes differ from rank 0's (they log the mismatch; empty: the
    check passes). Collective."""
    digests = [hashlib.sha1(p.data.to("cpu").float().numpy(force=True)).digest() for p in module.parameters()]
    local = torch.tensor([list(d) for d in digests], dtype=torch.int32)
    everyone = [torch.zeros_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, local, group=group)
    if all(torch.equal(everyone[0], e) for e in everyone):
        return []
    return [r for r, e in enumerate(everyone) if not torch.equal(e, everyone[0])]


def bits_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Bit-for-bit equality (NaN equals the same NaN; -0 differs from +0)."""
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return bool(
        torch.equal(
            a.detach().reshape(-1).view(ints[a.element_size()]), b.detach().reshape(-1).view(ints[b.element_size()])
        )
    )


def all_bits_equal(xs: Sequence[torch.Tensor | None], ys: Sequence[torch.Tensor | None]) -> bool:
    return len(xs) == len(ys) and all(bits_equal(x, y) for x, y in zip(xs, ys))


class SameDeviceResult:
    """One rank's verdict of a same-device re-run."""

    def __init__(self, local_differs: bool, reduced_differs: bool) -> None:
        self.local_differs = local_differs
        self.reduced_differs = reduced_differs


def rerun_step(
    ddp: torch.nn.Module,
    params: Sequence[torch.nn.Parameter],
    loss_fn: Callable[..., torch.Tensor],
    batch: Any,
    rng: torch.Tensor,
    tap: BucketTap,
    *,
    loss: torch.Tensor,
    local: Sequence[torch.Tensor],
    reduced: Sequence[torch.Tensor | None],
    after_backward: Callable[[], Any] | None = None,
) -> SameDeviceResult:
    """Same-device replay: the whole step again through DDP (every rank calls it: the reduction is collective),
    compared bit for bit with the original's ``loss``, bucket ``local`` gradients and ``reduced`` gradients.
    ``.grad`` and the random stream are left as they were."""
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    after = torch.get_rng_state()
    torch.set_rng_state(rng)
    try:
        tap.keep = True
        again = loss_fn(ddp, batch)
        again.backward()
        if after_backward is not None:
            after_backward()
        local2 = tap.take()
        reduced2 = [p.grad for p in params]
        local_differs = not (bits_equal(again.detach(), loss.detach()) and all_bits_equal(local2, local))
        return SameDeviceResult(local_differs, not all_bits_equal(reduced2, reduced))
    finally:
        tap.take()
        for p, g in zip(params, saved):
            p.grad = g
        torch.set_rng_state(after)
