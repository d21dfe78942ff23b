"""Checksum checks of every matmul a step runs, forward and backward, at the op level: a local check, no vote.

:class:`ChecksumMode` is a ``TorchDispatchMode`` that the guard pushes at ``begin_step`` of a checked step (one in
``checksum_every``) and pops at ``end_step``. It sees the aten ops below autograd, so it sees every matmul the
model runs whatever module issued it (``nn.Linear``'s ``addmm``/``mm``, transformers' ``Conv1D`` ``addmm``,
``nn.MultiheadAttention``'s ``F.linear``, attention written with ``bmm``/``matmul``) and the backward's ``dX`` and
``dW`` matmuls (autograd carries the mode into its threads). Each result is checked against its operands by
:func:`~.bound.check_matmul` right after the op, on the device, without a host sync; the op's result is
returned untouched, so the training step computes exactly what it computes without the guard.

At ``end_step`` one host read collects the step's counts. A matmul that failed is recomputed on the same device
from the same operands and checked again: failing again means *sticky*, passing means *transient* (the first result
or the first check was wrong: either way that device computed something wrong once). An operand changed in place
since (its version moved) or freed (FSDP2 frees an unsharded weight when it reshards) cannot be recomputed: the
verdict then says so (``sticky`` None; the step is still vetoed). On the CPU the count is read at once and a failed
matmul recomputed on the spot, while its operands live. The rank that computed is the suspect; nothing is voted on.

Each matmul of a checked step is counted once: *checked* (its bound can catch the smallest change claimed for its
dtype: :data:`~.bound.CLAIMS`), *unverifiable* (the backend's settings widen the bound past that claim, or make it
infinite: counted with the reason, warned once per setting with what would make it checkable; a finite bound still
counts what it can catch) or only *run* (not looked at: fused kernels, ``alpha``/``beta`` other than 1, dtypes the
bound does not know, or a call the check could not take). A check never breaks the step: any exception inside it is
caught, counted as run and warned once per op and exception type; the model's result is returned untouched.

Not seen: fused kernels that do a matmul inside another op (scaled-dot-product attention's flash/efficient kernels,
counted as run but not checked) and compiled regions (``torch.compile``'s generated code calls its kernels without
the dispatcher); replay and the cross-replica checks still cover them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, _get_current_dispatch_mode

from ...fingerprints import is_dtensor_type, is_wrapper_type
from ...logs import get_logger
from .bound import DEFAULT_ROWS, VacuousBound, check_matmul, unverifiable
from .precision import DEFAULT_SPLITS, Precision, precision_for

__all__ = ["ChecksumMode", "ChecksumFailure", "MatmulCall", "Pass"]

_log = get_logger("training")

Pass = Literal["forward", "dX", "dW"]

_CHECKED = {"mm", "addmm", "bmm", "baddbmm"}
_UNCHECKED = {
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
    "_scaled_mm",
    "_int_mm",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_cudnn_attention_backward",
}


_KINDS: dict[Any, str] = {}
"""Op overload -> what the mode does with it (:func:`_kind`), decided on its first call."""


def _kind(func: Any) -> str:
    """``"copy"`` (a dtype copy, followed), ``"unchecked"`` (a matmul counted as run, not checked), the name of a
    checked matmul (its default overload), or ``""`` (nothing)."""
    name = func.overloadpacket.__name__ if func.namespace == "aten" else ""
    if name == "_to_copy":
        return "copy"
    if name in _CHECKED:
        return name if func._overloadname == "default" else "unchecked"
    return "unchecked" if name in _UNCHECKED and "backward" not in name else ""


@dataclass(frozen=True)
class MatmulCall:
    """One checked matmul: what ran and where (kept until the step's counts are read)."""

    op: str
    where: str
    """The module that ran it (forward) or the autograd node (backward)."""
    phase: Pass
    func: Any
    args: tuple[Any, ...]
    versions: tuple[int, ...]


@dataclass(frozen=True)
class ChecksumFailure:
    """A matmul whose result failed its checksum on this rank, after the same-device recompute."""

    op: str
    where: str
    phase: Pass
    blocks: int
    """Block columns over the bound in the first check."""
    sticky: bool | None
    """True: the recompute failed again; False: it passed (transient); None: the operands changed since."""


def _operands(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, Any, Any] | None:
    """``(a, b, bias)`` of a checkable call (alpha = beta = 1), else None."""
    if name in ("mm", "bmm"):
        return args[0], args[1], None
    if kwargs.get("alpha", 1) != 1 or kwargs.get("beta", 1) != 1 or len(args) > 3:
        return None
    return args[1], args[2], args[0]


class ChecksumMode(TorchDispatchMode):
    """Checks each matmul as it runs (see the module docstring); counts the matmuls run, checked and unverifiable
    per step.

    Args:
        module: the model whose matmuls are checked (its parameters name the backward's passes).
        rows: rows of a result summed per checksum.
        splits: the most partial sums a split-K matmul adds in its output type (:data:`~.precision.DEFAULT_SPLITS`).
        settings_of: the device type whose precision settings the bound models (default: each result's own); a
            test on a machine without a GPU hands a GPU's settings (``"cuda"``) to CPU tensors this way.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        rows: int = DEFAULT_ROWS,
        splits: int = DEFAULT_SPLITS,
        settings_of: str | None = None,
    ) -> None:
        super().__init__()
        self.rows = rows
        self.splits = splits
        self.settings_of = settings_of
        self.run = self.checked = self.unverifiable = 0
        self.reasons: dict[str, list[Any]] = {}
        """This step's unverifiable matmuls: group (dtype and setting) -> [count, an example, its reason]."""
        self._precisions: dict[tuple[torch.dtype, str], Precision | None] = {}
        self._warned: set[str] = set()
        self.calls: list[MatmulCall] = []
        self._counts: list[torch.Tensor] = []
        self._failures: list[ChecksumFailure] = []
        self._params = {id(p) for p in module.parameters()}
        self._shapes = {tuple(p.shape) for p in module.parameters()}
        self._storages: set[int] = set()
        self._copies: list[torch.Tensor] = []
        self._names: list[str] = []
        self._hooks: list[Any] = []
        self._module_names = {id(m): n or type(m).__name__ for n, m in module.named_modules()}
        self.active = False
        self._module = module

    # ------------------------------------------------------------------ where an op runs (names for incidents)

    def _enter(self, module: nn.Module, args: Any) -> None:
        if self.active:
            self._names.append(self._module_names.get(id(module), type(module).__name__))

    def _leave(self, module: nn.Module, args: Any, out: Any) -> None:
        if self.active and self._names:
            self._names.pop()

    def _phase(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> tuple[Pass, str]:
        if torch._C._current_graph_task_id() == -1:
            return "forward", self._names[-1] if self._names else "model"
        node = torch._C._current_autograd_node()
        where = node.name() if node is not None else "backward"
        if any(self._is_param(t) for t in (a, b)):
            return "dX", where
        return ("dW" if tuple(out.shape) in self._shapes or tuple(out.shape[::-1]) in self._shapes else "dX"), where

    def _is_param(self, t: torch.Tensor) -> bool:
        try:
            return t.untyped_storage().data_ptr() in self._storages
        except RuntimeError:
            return False

    # ------------------------------------------------------------------------------------------ the step

    def begin(self) -> None:
        """Start a checked step (the guard calls it; the mode is then pushed)."""
        if self.active:  # a step that never ended (an exception in the framework's loop): forget it
            self.end()
        self.run = self.checked = self.unverifiable = 0
        self.reasons, self._precisions = {}, {}  # the settings are read once per step
        self.calls, self._counts, self._names, self._failures = [], [], [], []
        self._storages, self._copies = set(), []
        for p in self._module.parameters():
            try:
                self._storages.add(p.untyped_storage().data_ptr())
            except RuntimeError:  # a sharded or fake parameter: the shape rule names its passes
                pass
        self.active = True
        # module hooks only while a checked step runs: they name the layer of a forward matmul
        self._hooks = [m.register_forward_pre_hook(self._enter) for m in self._module.modules()]
        self._hooks += [m.register_forward_hook(self._leave) for m in self._module.modules()]
        self.__enter__()

    def end(self) -> list[ChecksumFailure]:
        """Pop the mode; read the step's counts (one host sync), recompute what failed; the failures."""
        if not self.active:
            return []
        self.active = False
        self.close()
        if _get_current_dispatch_mode() is not self:
            raise RuntimeError(
                "sdcguard: another TorchDispatchMode was entered during the step and is still "
                "active at end_step; the checksum mode cannot be removed under it"
            )
        self.__exit__(None, None, None)
        try:
            counts = torch.stack(self._counts).tolist() if self._counts else []
        except Exception as e:  # the counts live on several devices, or the device failed: nothing was judged
            self._refuse("the step's counts", e)
            counts = []
        failures = self._failures + [self._recheck(call, int(n)) for call, n in zip(self.calls, counts) if n]
        self.calls, self._counts, self._failures, self._copies = [], [], [], []
        return failures

    def named(self) -> tuple[str, ...]:
        """This step's unverifiable matmuls, one line per setting: how many, an example and why."""
        return tuple(
            f"{n} matmul(s) with {group}, e.g. {example}: {why}" for group, (n, example, why) in self.reasons.items()
        )

    def close(self) -> None:
        """Remove the module hooks of a checked step."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(is_dtensor_type(t) for t in types):
            # A DTensor op: let DTensor dispatch, with this mode still active, to the plain ops it runs on this rank's
            # shards, which are the matmuls this rank computes and the ones checked.
            return NotImplemented
        kwargs = kwargs or {}
        if any(is_wrapper_type(t) for t in types):  # fake tensors of DTensor's sharding propagation: no data
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        kind = _KINDS.get(func)
        if kind is None:  # most ops of a step: nothing to do, decided once per op
            kind = _KINDS[func] = _kind(func)
        if kind == "":
            return out
        if kind == "copy":  # autocast's copy of a weight is the weight, for naming the backward's passes
            self._follow_copy(args, out)
            return out
        self.run += 1
        if kind != "unchecked":
            try:
                self._check(kind, func, args, kwargs, out)
            except Exception as e:  # a check never breaks the step: counted as run, not checked
                self._refuse(f"aten.{kind}", e)
        return out

    def _refuse(self, what: str, e: Exception) -> None:
        key = f"{what}:{type(e).__name__}"
        if key not in self._warned:
            self._warned.add(key)
            _log.warning("could not check %s (%s: %s); such calls count as run, not checked", what, type(e).__name__, e)

    def _precision(self, out: torch.Tensor) -> Precision | None:
        key = (out.dtype, self.settings_of or out.device.type)
        if key not in self._precisions:
            self._precisions[key] = precision_for(out.dtype, torch.device(key[1]), splits=self.splits)
        return self._precisions[key]

    def _note_unverifiable(self, why: str, p: Precision, name: str, args: Any, out: torch.Tensor) -> None:
        self.unverifiable += 1
        group = f"{str(out.dtype).removeprefix('torch.')} results under {p.setting or 'their own rounding'}"
        entry = self.reasons.get(group)
        if entry is not None:
            entry[0] += 1
            return
        _, where = self._phase(args[0], args[1], out)
        self.reasons[group] = [1, f"aten.{name} in {where}", why]
        if group not in self._warned:
            self._warned.add(group)
            _log.warning(
                "matmuls with %s are counted unverifiable, not checked: %s. %s", group, why, self._remedy(p, out, args)
            )

    def _remedy(self, p: Precision, out: torch.Tensor, args: Any) -> str:
        """What would make such a matmul checkable: fewer rows per checksum, else the setting itself."""
        m, k = out.shape[-2], args[2]
        rows = self.rows // 2
        while rows >= 1 and unverifiable(p, out.dtype, m=m, k=k, rows=rows) is not None:
            rows //= 2
        fix = f"checksum_rows={rows} would check it (at 2/{rows} of its multiply-adds); " if rows >= 1 else ""
        return fix + (f"or change {p.setting}" if p.setting else "")

    def _follow_copy(self, args: Any, out: Any) -> None:
        if args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor) and self._is_param(args[0]):
            try:
                self._storages.add(out.untyped_storage().data_ptr())
            except RuntimeError:
                return
            self._copies.append(out)  # held for the step, so its memory is not reused by another tensor meanwhile

    def _check(self, name: str, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        ops = _operands(name, args, kwargs)
        if ops is None or not isinstance(out, torch.Tensor):
            return
        a, b, bias = ops
        p = self._precision(out)
        if p is None or a.dtype != out.dtype or b.dtype != out.dtype or out.dim() < 2:
            return
        k = a.shape[-1] + (1 if bias is not None else 0)
        why = unverifiable(p, out.dtype, m=out.shape[-2], k=k, rows=self.rows)
        count: torch.Tensor | None = None
        try:
            # the check's own ops are no computation of the model's: no mode below this one sees them (this one is
            # off in here; switching modes costs a little, so only when there is one)
            below = _disable_current_modes() if torch._C._len_torch_dispatch_stack() else contextlib.nullcontext()
            with below:
                count = check_matmul(a, b, out, bias=bias, precision=p, rows=self.rows)
        except VacuousBound:  # no result could fail it: unverifiable, and nothing to read
            pass
        if why is not None:  # counted once the check was made (an exception above leaves the matmul only run)
            self._note_unverifiable(why, p, name, (a, b, k), out)
        else:
            self.checked += 1
        if count is None:
            return
        if out.device.type == "cpu":  # reading the count costs no sync here: recompute now, while operands live
            if n := int(count):
                self._failures.append(self._recheck(self._call(name, func, args, a, b, out), n))
            return
        self._counts.append(count)  # a device: read once at end_step, so the checks never stall the stream
        self.calls.append(self._call(name, func, args, a, b, out))

    def _call(self, name: str, func: Any, args: Any, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> MatmulCall:
        """What ran, where, and its operands' versions (called while the op's autograd context is current)."""
        phase, where = self._phase(a, b, out)
        tensors = tuple(t for t in args if isinstance(t, torch.Tensor))
        return MatmulCall(
            op=f"aten.{name}",
            where=where,
            phase=phase,
            func=func,
            args=tuple(args),
            versions=tuple(t._version for t in tensors),
        )

    def _recheck(self, call: MatmulCall, blocks: int) -> ChecksumFailure:
        tensors = tuple(t for t in call.args if isinstance(t, torch.Tensor))
        sticky: bool | None = None
        try:
            # an operand changed in place since, or freed (FSDP2 frees an unsharded weight's storage when it reshards)
            alive = all(t.untyped_storage().nbytes() > 0 or t.numel() == 0 for t in tensors)
            if alive and tuple(t._version for t in tensors) == call.versions:
                name = call.op.removeprefix("aten.")
                operands = _operands(name, call.args, {})
                assert operands is not None  # only checkable calls are recorded
                a, b, bias = operands
                out = call.func(*call.args)  # seen by the modes below (a sticky fault recomputes wrong again)
                p = self._precision(out)
                assert p is not None
                with _disable_current_modes():
                    sticky = int(check_matmul(a, b, out, bias=bias, precision=p, rows=self.rows)) > 0
        except Exception as e:  # the recompute could not be made: the failure stands, its stickiness unknown
            self._refuse(f"the recompute of {call.op}", e)
            sticky = None
        return ChecksumFailure(op=call.op, where=call.where, phase=call.phase, blocks=blocks, sticky=sticky)
