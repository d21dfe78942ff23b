"""What the guard says once, when it starts: setups that limit what its checks can see, and the compiled-model
note (said where the guard turns the checksums off). Pure: the messages from facts every rank holds; the guard
logs them on the ranks that speak."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["construction_notices", "COMPILED_NOTICE"]

COMPILED_NOTICE = (
    "the model has compiled regions (torch.compile): the matmul checksums are off for it, since compiled code run "
    "under a dispatch mode computes differently; replay and the cross-replica checks, which run through the compiled "
    "code, stay on"
)
"""What the guard says when it turns the checksums off for a compiled model."""


def construction_notices(
    *,
    speaks: bool,
    replicas: bool,
    job_size: int,
    cuda_problems: list[str],
    setups: Mapping[int, tuple[str, ...]],
    worker: bool = True,
    compiled: bool = False,
) -> list[str]:
    """The warnings of a starting rank (``speaks``: one rank of the job says the job-wide ones; ``replicas``: some
    two ranks hold the same shard; ``cuda_problems``: settings that keep CUDA replays from being bit-identical;
    ``worker``: a dedicated shadow says none; ``compiled``: the model has compiled regions and the checksums were on,
    so the guard turns them off and says why)."""
    out: list[str] = []
    if not worker:
        return out
    if speaks and compiled:
        out.append(COMPILED_NOTICE)
    if speaks and job_size > 1 and not replicas:
        out.append(
            "no two ranks hold the same shard of any parameter (FSDP2 over every rank, or FSDP2 x TP without a "
            "replicate dimension): the cross-replica checks have nothing to compare; replay and the matmul checksums "
            "check the computation, and each rank's own memory check sees a weight shard corrupted in memory"
        )
    if cuda_problems:
        out.append(
            "replays on CUDA will not be bit-identical, so replay checks will turn themselves off: "
            + "; ".join(cuda_problems)
        )
    if speaks and len(set(setups.values())) > 1:
        kinds = " | ".join(sorted({", ".join(v) for v in setups.values()}))
        out.append(
            f"the devices of this job run different setups ({kinds}); replays between devices of different setups "
            "may differ without any fault, and such a disagreement is reported as the setup's, never blamed on a "
            "device"
        )
    return out
