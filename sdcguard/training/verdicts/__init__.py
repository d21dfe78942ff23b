"""Verdicts: pure functions of frozen values that every rank evaluates alike. :mod:`.attribution` (the rule of
evidence), :mod:`.calibration` (is the setup bit-reproducible), :mod:`.outcomes` (a round's result, escalation,
roll-back), :mod:`.verification` (which steps the checks vouch for) and :mod:`.local` (what a rank shows of itself:
its memory, non-finite values)."""
