"""The training side of sdcguard: the guard that watches each training step (:class:`~.guard.SDCGuard`), the hooks
of each parallelism (:mod:`.ddp`, :mod:`.fsdp`), capture and replay, the peer and shadow rounds, attribution,
calibration, the cross-replica checks and the framework adapters (:mod:`.adapters`).

Everything here needs torch. The public names are importable from ``sdcguard`` (``sdcguard.SDCGuard``, ...); the
fleet side never imports this package.
"""
