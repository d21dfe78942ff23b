"""Our matmul checksum checks beside the PyPI peer's, on the same injected faults, in one run (issue 23).

The PyPI package ``sdcguard`` 0.4.0 is a different project with our import name: it checks ``nn.Linear`` matmuls
(forward, dX, dW) with block column checksums (``SDCGuard(every=N).protect(model)``, then ``with
guard.on_step(step):`` around forward and backward; a detection is an ``SDCEvent`` in ``guard.log.events`` and a
count in ``guard.stats["alerts"]``). Without ``protect()`` the same guard is a ``TorchDispatchMode`` that checks
every aten matmul it sees (``bmm`` in attention too). Since both packages are imported as ``sdcguard`` they never
share a process: ours runs from the project's ``.venv``, the peer from its own virtualenv (``--venv``, created or
reused: CPU ``torch==2.13.0``, ``sdcguard==0.4.0``, numpy), each as a worker process driven over a pipe, one JSON
line per command.

**The fault.** One injector module, :mod:`.injector`, loaded by its path by both workers (its sha256 is compared):
it imports torch and the standard library only. It changes one element (or one 16x16 tile) of the result of the
model's k-th aten matmul (``mm``/``addmm``/``bmm``/``baddbmm``, numbered in the order a forward+backward issues
them) with two ``TorchDispatchMode`` s: ``above()``, entered innermost (after the checker), numbers the matmuls the
*model* issues and marks the k-th call; ``below()``, entered outermost (before the checker), corrupts the marked
call's result in place when that call reaches it, so the checker sees the faulty result as it would see a faulty
GPU's. A checker that is a dispatch mode (ours; the peer's default mode) issues its own check ops from inside its
``__torch_dispatch__``, below ``above()``, so they are never numbered; a checker that runs its checks at the model's
level (the peer's ``protect()``) is kept out by its files (``skip_files``: a matmul whose Python stack passes through
the peer's ``checksum.py``/``_group.py``/``fused.py``/``screen.py``/``attention.py`` is not numbered). Each fault is
one step of the benchmark transformer (``sdcguard/testing/models.py``: d=256, 4 heads, 4 layers, 128 tokens, batch
8; the same batch and dropout seed for every tool) at fixed weights; the fault classes and their targets are
:mod:`.faults`.

Also: false alarms over ``--clean`` training steps (SGD) checked on every step, and the cost: the median step time
(forward + backward + SGD, one thread) of plain steps against each tool checking every step, in ``--rounds``
interleaved rounds, printed as ratios to the same worker's plain steps. The cost at a tool's default sampling (ours:
``checksum_every=4``; the peer: ``every=10``) is ``(checked + (N - 1) x unchecked) / N`` from those medians, where
``unchecked`` is a plain step for ours and the peer's dispatch mode, and a ``protect()`` ed model's step outside a
checked step for the peer.

The parts, by job: :mod:`.injector` (the fault), :mod:`.checkers` (each tool's step), :mod:`.worker` (a worker
process: its models, sessions and commands), :mod:`.processes` (the peer's virtualenv, starting the workers, the
pipe), :mod:`.faults` (the classes and the plan), :mod:`.run` (one run, phase by phase), :mod:`.report` (the tables)
and ``__main__`` (the command line). Run::

    .venv/bin/python -m benchmarks.peer_checksums [--faults 20] [--clean 200] [--dtypes fp32,bf16] [--rounds 6]
        [--json FILE] [--venv .venv-peer] [--no-peer]

(``python benchmarks/peer_checksums`` runs the same.) Prints a markdown table to stdout (progress to stderr);
``--json`` writes every figure and every fault's record. Nothing is asserted: the figures are printed as measured.
"""
