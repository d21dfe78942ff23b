"""What the tests, the benchmarks, the examples and the GPU check share, outside the library's import graph (no
module of sdcguard imports this package): :mod:`.ranks` runs a function on N local processes joined in one gloo
process group under a deadline, :mod:`.models` is a tiny transformer with a loss and batches for them, :mod:`.moe` a
tiny mixture-of-experts model with an expert-parallel dispatch, and :mod:`.hf` a Hugging Face ``Trainer`` callback
recording what each optimizer step did beside the guard's."""

from .ranks import GROUP_NOT_FORMED, RankFailed, run_ranks, run_ranks_once

__all__ = ["run_ranks", "run_ranks_once", "RankFailed", "GROUP_NOT_FORMED"]
