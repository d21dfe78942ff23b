"""Checks a rank makes of itself, with no vote: its own shards against their fingerprint from after the optimizer
step (:mod:`.memory`), non-finite losses and gradients (:mod:`.finite`). Their verdicts: :mod:`..verdicts.local`."""
