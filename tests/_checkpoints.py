"""Test helpers for checkpoints: a briefly trained guarded model, and damage to one stored tensor the way a rotted
disk block would do it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["flip_byte_of", "trained"]


def trained(steps: int, store: Path | None = None) -> tuple:
    """``(model, optimizer, guard)`` after ``steps`` guarded AdamW steps of the tiny transformer (seed 0)."""
    import torch

    from sdcguard import SDCGuard
    from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch

    torch.manual_seed(0)
    model = TinyTransformer()
    guard = SDCGuard(model, lm_loss, replay_every=1, store=store)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for s in range(steps):
        assert guard.step(s, make_batch(s, 0)).commit
        opt.step()
        opt.zero_grad()
    return model, opt, guard


def flip_byte_of(path: Path, key: str, at: int = 7) -> None:
    """Flip one bit in the stored data of ``key``'s first chunk (found through DCP's own metadata and the zip record
    ``torch.save`` wrote for it): a rotted byte on disk."""
    import io
    import struct
    import zipfile

    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(str(path)).read_metadata()
    info = next(v for k, v in sorted(md.storage_data.items(), key=lambda kv: str(kv[0].offset)) if k.fqn == key)
    blob = bytearray((path / info.relative_path).read_bytes())
    record = zipfile.ZipFile(io.BytesIO(bytes(blob[info.offset : info.offset + info.length])))
    entry = next(z for z in record.infolist() if z.filename.endswith("/data/0"))
    name_len, extra_len = struct.unpack(
        "<HH", blob[info.offset + entry.header_offset + 26 : info.offset + entry.header_offset + 30]
    )
    start = info.offset + entry.header_offset + 30 + name_len + extra_len  # the tensor's raw bytes
    blob[start + min(at, entry.file_size - 1)] ^= 0x10
    (path / info.relative_path).write_bytes(bytes(blob))
