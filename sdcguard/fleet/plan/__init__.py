"""``sdcguard plan``: a job's checkpoint interval and check cadence from the devices it will run on.

:mod:`.intervals` (Young's and Daly's intervals, goodput), :mod:`.cadence` (what ``replay_every`` and
``checksum_every`` buy and cost, from the detection campaign). docs/plan.md has the formulas and their limits.
"""
