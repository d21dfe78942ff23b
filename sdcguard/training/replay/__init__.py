"""Replay: :mod:`.capture` takes what a recomputation needs (the micro-batch, random states, autocast state),
:mod:`.observe` watches the framework's own step to take it, and :mod:`.recompute` runs one captured micro-batch
again and fingerprints its loss and local gradients."""
