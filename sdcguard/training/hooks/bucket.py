"""The gradient's path into DDP's reduction, checked by the rank itself: what DDP all-reduces against what this
rank's backward produced.

The guard's tensor hook on a parameter (:mod:`.ddp`) sees its gradient as autograd hands it over. After it, hooks
registered on the parameter later (a user's, a fault injector's), autograd's accumulation into ``.grad`` and DDP's
copy into its bucket may still change it, and whatever they made is all-reduced: every replica then holds the same
wrong gradient, the replay (which reads the tensor hook's gradient) agrees with the original, and the cross-replica
check has nothing to see. So, on every step, the tensor hook also fingerprints the gradient DDP should reduce for the
parameter: the gradient itself where ``.grad`` is None (autograd takes it as it is), else ``.grad`` plus it
(autograd's accumulation, the same addition bit for bit: the last micro-batch of a ``no_sync`` accumulation, or a
loop that zeroes with ``set_to_none=False``); and the guard's DDP comm hook fingerprints each parameter's view of the
bucket before the all-reduce. A parameter whose two fingerprints differ was changed on its way into the reduction,
on this rank: it is named alone, with no vote (:func:`~..verdicts.local.reduction_incidents`). The comm hook then
reduces the bucket as DDP does without one (:func:`~..comm.average_bucket`), so training is bit for bit plain DDP's.

Under ``no_sync`` accumulation DDP reduces only the sum of the micro-batches, so each earlier micro-batch's path is
checked where the next one's tensor hook reads ``.grad`` (before adding to it): it must be what the hook expected
once its own gradient was added, so a change made to a gradient of any micro-batch is seen, at a cost of one more
read of ``.grad`` per parameter and micro-batch. Compared: only the parameters whose gradient the tensor hook saw (a
parameter unused in the synchronising backward, whose bucket view DDP fills with zeros or an old ``.grad``, is not;
nor one that no later micro-batch reaches after a ``no_sync`` one).

Hooks registered on a parameter before the guard run before its tap, so the tap, the bucket and the replay all see
what they made; a hook registered after the guard that changes the gradient is what this check detects (register a
hook that changes gradients before constructing the guard).

A comm hook of the user's own keeps working: one registered after the guard (``ddp.register_comm_hook``, which the
guard takes over on that wrapper) is called by the guard's hook right after the comparison, in place of DDP's
reduction, so the path is still checked; one registered before it holds DDP's one place, and the wrapper is not
watched. Not watched either, and said once at construction: a module with sparse gradients, DDP's Python reducer
(compiled autograd); a built-in comm hook cannot be registered after the guard.

The cost per step: one fingerprint pass over the gradients in the tensor hooks (and an addition where ``.grad``
already holds a value, and a read of it after a ``no_sync`` micro-batch), one over the buckets in the comm hook, on
the device without a sync, and three integers in the step's gather.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ...fingerprints import fingerprints_on_device
from ..comm import average_bucket

__all__ = ["ReductionWatch", "unwatchable"]


def unwatchable(ddp: DistributedDataParallel) -> str | None:
    """Why the guard cannot put its comm hook on ``ddp`` (None: it can)."""
    if getattr(ddp, "_comm_hooks", None):  # DDP's list of the hooks registered through register_comm_hook
        return "the DDP model has a comm hook of its own (DDP takes one)"
    if getattr(ddp, "_use_python_reducer", False):
        return "DDP runs its Python reducer (compiled autograd)"
    sparse = (nn.Embedding, nn.EmbeddingBag)
    if any(isinstance(m, sparse) and m.sparse for m in ddp.module.modules()):
        return "the module has sparse gradients"
    return None


class ReductionWatch:
    """This rank's gradients on their way into DDP's all-reduce (see the module docstring): :meth:`expect` from the
    tensor hooks, the comparison in the comm hook, :meth:`take` once per step."""

    def __init__(self, params: Sequence[nn.Parameter], device: torch.device) -> None:
        self.params = list(params)
        self.device = device
        self.enabled = True
        """Whether the check runs (``benchmarks/reduction_path.py`` and ``replay_overhead.py`` turn it off to measure
        what it costs)."""
        self.refused: str | None = None
        """Why the last DDP model offered was not watched (None: watched, or none offered)."""
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._ddp: DistributedDataParallel | None = None
        self._expected = torch.zeros(len(self.params), dtype=torch.int64, device=device)
        self._seen = [False] * len(self.params)
        """Expected at the comm hook (from a backward that synchronises)."""
        self._pending = [False] * len(self.params)
        """Expected at the parameter's next tensor hook (from a backward under ``no_sync``)."""
        self._compared = 0
        self._bad = torch.zeros((), dtype=torch.int64, device=device)
        self._first = torch.full((), len(self.params), dtype=torch.int64, device=device)

    def watch(self, ddp: DistributedDataParallel) -> bool:
        """Put the guard's comm hook on ``ddp`` (the model the loop trains now; once per wrapper) and watch it."""
        if ddp is self._ddp:
            return True
        self._seen = [False] * len(self.params)  # nothing expected of another wrapper's backward (a recovery's warm-up)
        self._pending = [False] * len(self.params)
        earlier = [h for h, _ in getattr(ddp, "_comm_hooks", ()) if isinstance(h, _BucketHook)]
        if earlier:  # an earlier guard's hook holds the place (a guard built again on the same wrapper): this one's
            earlier[0].watch, self._ddp, self.refused = self, ddp, None
            return True
        self.refused = unwatchable(ddp)
        if self.refused is not None:
            self._ddp = None
            return False
        hook = _BucketHook(self, ddp)
        try:
            ddp.register_comm_hook(ddp.process_group, hook)
            # a comm hook the user registers from now on is called by the guard's, after the comparison
            ddp.register_comm_hook = hook.register  # type: ignore[method-assign]  # that wrapper's one place
        except RuntimeError:  # a built-in comm hook (register_builtin_comm_hook) holds DDP's one place
            hooks = getattr(ddp, "_comm_hooks", [])
            if hooks and hooks[-1][0] is hook:
                hooks.pop()
            self.refused, self._ddp = "the DDP model has a built-in comm hook (DDP takes one)", None
            return False
        self._ddp = ddp
        return True

    def expect(self, index: int, grad: torch.Tensor) -> None:
        """From the tensor hook of parameter ``index``: fingerprint what ``.grad`` will hold once autograd has added
        ``grad`` to it: in a backward that synchronises, what DDP should reduce (the comm hook compares); under
        ``no_sync``, what the next micro-batch's tensor hook must find in ``.grad`` (compared then)."""
        ddp = self._ddp
        if ddp is None or not self.enabled:
            return
        held = self.params[index].grad
        if self._pending[index]:  # the micro-batch before accumulated without reduction: is .grad what it should be?
            self._pending[index] = False
            if held is not None:
                self._judge(torch.tensor([index], device=self.device), fingerprints_on_device([held.detach()]))
        value = grad.detach() if held is None else held.detach() + grad.detach()
        self._expected[index : index + 1] = fingerprints_on_device([value]).to(self.device)
        if ddp.require_backward_grad_sync:
            self._seen[index] = True
        else:
            self._pending[index] = True

    def compare(self, ddp: DistributedDataParallel, bucket: dist.GradBucket) -> None:
        """From the comm hook, before the all-reduce: each expected parameter's view of the bucket against what its
        tensor hook expected (on the device, no sync)."""
        if ddp is not self._ddp or not self.enabled:
            return
        try:
            self._compare(bucket)
        finally:
            if bucket.is_last():  # the backward's every bucket was handed over: nothing more is expected of it
                self._seen = [False] * len(self.params)

    def _compare(self, bucket: dist.GradBucket) -> None:
        picked = [
            (i, view)
            for p, view in zip(bucket.parameters(), bucket.gradients())
            if (i := self._index.get(id(p), -1)) >= 0 and self._seen[i]
        ]
        if not picked:
            return
        for i, _ in picked:
            self._seen[i] = False
        index = torch.tensor([i for i, _ in picked], dtype=torch.int64, device=self.device)
        self._judge(index, fingerprints_on_device([v for _, v in picked]))

    def _judge(self, index: torch.Tensor, found: torch.Tensor) -> None:
        """Count the parameters ``index`` whose fingerprints ``found`` differ from what was expected of them."""
        bad = found.to(self.device) != self._expected[index]
        self._bad += bad.sum()
        self._first = torch.minimum(self._first, torch.where(bad, index, len(self.params)).min())
        self._compared += index.numel()

    def take(self) -> torch.Tensor:
        """``(parameters compared, how many differed, the first one's index)`` since the last call, int64 on the
        device; the counts start again."""
        out = torch.stack([torch.tensor(self._compared, device=self.device), self._bad, self._first])
        self._compared = 0
        self._bad = torch.zeros((), dtype=torch.int64, device=self.device)
        self._first = torch.full((), len(self.params), dtype=torch.int64, device=self.device)
        self._seen = [False] * len(self.params)
        self._pending = [False] * len(self.params)
        return out


class _BucketHook:
    """The guard's DDP comm hook: compare (:meth:`ReductionWatch.compare`), then reduce as plain DDP."""

    def __init__(self, watch: ReductionWatch, ddp: DistributedDataParallel) -> None:
        self.watch = watch
        self.ddp = ddp
        self.inner: tuple[Any, Any] | None = None
        """The user's comm hook registered after the guard's, and its state."""
        self.__name__ = self.__qualname__ = "sdcguard_reduction_check"  # DDP names its hook by these

    def register(self, state: object, hook: Any) -> None:
        """``ddp.register_comm_hook`` once the guard's hook holds DDP's one place: ``hook`` reduces in DDP's stead,
        called with ``state`` and each bucket after the comparison; once, as DDP allows."""
        if self.inner is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        if not callable(hook):
            raise TypeError("Communication hook must be callable.")
        self.inner = (hook, state)

    def __call__(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        self.watch.compare(self.ddp, bucket)
        if self.inner is not None:
            hook, its_state = self.inner
            future: torch.futures.Future[torch.Tensor] = hook(its_state, bucket)
            return future
        return average_bucket(bucket.buffer(), state)


# DDP checks a hook's annotations against the real classes; with postponed annotations they would be strings.
_BucketHook.__call__.__annotations__.update({"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]})
