"""Checks a rank makes of itself, with no vote: its own shards against their fingerprint from after the optimizer
step (:mod:`.memory`), non-finite losses and gradients (:mod:`.finite`), its gradients on their way into DDP's
reduction (:mod:`.reduction`). Their verdicts: :mod:`..verdicts.local`."""
