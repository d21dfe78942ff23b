"""The fleet side of sdcguard: the store and everything that reads it.

:mod:`.store` (the one SQLite file: it alone holds SQL, with :mod:`.store.schema` and its migrations), :mod:`.rates`
(per-device SDC rates and their Clopper-Pearson bounds), :mod:`.policy` (quarantine rules and circuit breakers,
on a node's own store or the fleet's merged one), :mod:`.merge` (per-node stores into one), :mod:`.report`,
:mod:`.report.plot`, :mod:`.report.prometheus` (what operators read) and :mod:`.actions` (drain, taint, any command).

Nothing here imports torch or cupy: a scan node and the report run without them. The training side records
incidents through :meth:`.store.training.Training.record_incident` only.
"""
