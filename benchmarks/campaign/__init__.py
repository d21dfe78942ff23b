"""The detection campaign behind ``benchmarks/detection.py`` and ``docs/detection.md``.

- :mod:`.faults`: the fault grid (target x bit class x timing) and how each fault is injected at a public seam;
- :mod:`.baselines`: Megatron-LM's shipped checks and same-device replay, watching the same steps as the guard;
- :mod:`.peer`: the 3-rank DDP job (clean steps, one fault per trial, validation episodes at real settings);
- :mod:`.shadow`: the job with a dedicated shadow (continuous verification);
- :mod:`.frameworks`: the same faults through the Lightning callback and an FSDP2 model;
- :mod:`.schedule`: from what one check sees on one step to the chance of detection within N steps;
- :mod:`.report`: the tables.
"""
