"""The training side of sdcguard: the guard that watches each training step (:class:`~.guard.SDCGuard`), grouped by
job: :mod:`.hooks` (one set of hooks per parallelism), :mod:`.replay` (capture and recompute), :mod:`.rounds` (peer
and dedicated-shadow replay), :mod:`.verdicts` (attribution, calibration, outcomes), :mod:`.checksums` (matmul
checksums); at the top the guard and its parts (its settings, communication, device identity, digests, the
cross-replica check, incidents' handling, timing). The framework adapters that use it are :mod:`sdcguard.adapters`;
verified checkpoints are :mod:`sdcguard.checkpoint`.

Everything here needs torch. The public names are importable from ``sdcguard`` (``sdcguard.SDCGuard``, ...); the
fleet side never imports this package.
"""
