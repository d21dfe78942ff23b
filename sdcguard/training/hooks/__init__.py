"""The guard's hooks, one :class:`~.taps.Taps` per parallelism: where each framework hands its local gradients
over, and how a replay's backward runs without reducing or keeping anything (:mod:`.ddp`: DDP and a single
process; :mod:`.fsdp`: FSDP2 and HSDP)."""
