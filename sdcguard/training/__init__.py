"""The training side of sdcguard: the guard that watches each training step (:class:`~.guard.SDCGuard`), the hooks
of each parallelism (:mod:`.ddp`, :mod:`.fsdp`), capture and replay, the peer and shadow rounds, attribution,
calibration and the cross-replica checks. The framework adapters that use it are :mod:`sdcguard.adapters`.

Everything here needs torch. The public names are importable from ``sdcguard`` (``sdcguard.SDCGuard``, ...); the
fleet side never imports this package.
"""
