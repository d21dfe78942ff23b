"""Verified recovery (``escalate="recover"``): snapshots of verified states in host memory (:mod:`.snapshot`), the
one job-wide decision (:mod:`.plan`), the votes (:mod:`.vote`), the engine that re-forms the job (:mod:`.engine`)
and a guard's use of them (:mod:`.recover`); torchft's replica groups: their verdict (:mod:`.groups`) and the engine
that makes the guard torchft's verifier (:mod:`.torchft`)."""
