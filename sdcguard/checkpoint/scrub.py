"""Scrubbing checkpoints at rest: re-read every tensor of a verified DCP checkpoint and compare it with the
fingerprint recorded when it was saved, without loading it into a model.

A checkpoint is read the way it lies on disk: data file by data file, each item in file order, in pieces of 4 MiB
into one reused buffer (sequential reads; the kernel's readahead keeps the disk busy while a piece is
fingerprinted, and the piece is fingerprinted while it is still in the CPU's cache: a reader thread filling a ring
of buffers ahead was slower on a loaded machine). A tensor whose raw bytes are its bytes in order (the usual case:
:func:`.torchzip.head` says) is fingerprinted piece by piece as it streams past
(:class:`~sdcguard.fingerprints.StreamingFingerprint`): memory stays at 4 MiB whatever the checkpoint. Other
layouts (a transposed or channels-last tensor, float8) are collected whole and decoded (memory: that item); so is
any item whose streamed fingerprint differs, read a second time: a verdict of corruption always comes from the
full decoding. Each data file's clean pages
are dropped from the page cache before it is read and after (``posix_fadvise(DONTNEED)``): the bytes checked come
from the storage, not from a copy in memory that would hide rot on the disk, and a scrub of terabytes leaves a
node's page cache alone. The verdict of one checkpoint:

- ``clean``: every saved tensor was read and matched a recorded fingerprint of its key (a sharded key: one of
  its shards');
- ``corrupt``: a tensor differs (its key is named), or a data file is shorter than DCP's index says, or DCP's
  index (``.metadata``) or the record (``sdcguard.json``) is damaged (named as such: their own fingerprints are
  recorded too);
- ``unverified``: nothing read differs, but some saved tensors could not be compared (named in ``unverified``):
  keys without a recorded fingerprint, and items saved with transforms (DCP's ``transform_descriptors``: their
  stored bytes are not the tensor's);
- ``unreadable``: it could not be checked (not a checkpoint, no record, an I/O error).

``tensors`` counts the items compared, ``unverified`` names the others. Non-tensor items (DCP's pickled bytes, e.g.
learning rates) have no fingerprint by design and are not checked.
"""

from __future__ import annotations

import io
import mmap
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import CheckpointError
from ..fingerprints import StreamingFingerprint, fingerprint_many
from .layout import METADATA, SIDECAR, candidates, is_checkpoint, metadata_damage
from .record import read_record
from .torchzip import Head, head, view_tensor

__all__ = ["ScrubResult", "scrub", "scrub_one", "latest_good", "expand"]

_PIECE = 4 << 20
"""Bytes of an item read and fingerprinted at a time (the one buffer a scrub holds)."""

_READ = 1 << 20
"""Bytes per read call: small enough that the kernel's readahead keeps the disk busy during a piece."""

Progress = Callable[[int], None]
"""Called with the number of bytes just read."""


@dataclass(frozen=True, kw_only=True)
class ScrubResult:
    """The verdict on one checkpoint (see the module docstring)."""

    checkpoint_id: str
    status: Literal["clean", "corrupt", "unverified", "unreadable"]
    tensors: int
    """Tensors (chunks) read and compared with a recorded fingerprint."""
    bytes: int
    """Bytes of data read."""
    bad: tuple[str, ...] = ()
    """The keys of the tensors that differ, or the damaged file (``.metadata``, ``sdcguard.json``)."""
    unverified: tuple[str, ...] = ()
    """The keys of the saved tensors that could not be compared (no recorded fingerprint, saved with transforms)."""
    detail: str = ""
    seconds: float = 0.0


def expand(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Checkpoints named, a directory of checkpoints standing for each checkpoint directly under it."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir() and not is_checkpoint(p):
            inside = sorted(c for c in p.iterdir() if c.is_dir() and is_checkpoint(c))
            out += inside or [p]
        else:
            out.append(p)
    return out


def scrub(paths: Iterable[str | os.PathLike[str]], *, progress: Progress | None = None) -> list[ScrubResult]:
    """Scrub each checkpoint in turn (directories of checkpoints expanded)."""
    return [scrub_one(p, progress=progress) for p in expand(paths)]


def scrub_one(path: str | os.PathLike[str], *, progress: Progress | None = None) -> ScrubResult:
    """Re-read one checkpoint and compare every tensor with its recorded fingerprint; never raises for a bad
    checkpoint (the verdict says what is wrong)."""
    path = Path(path)
    start = time.monotonic()

    def verdict(
        status: Any,
        detail: str,
        bad: Sequence[str] = (),
        tensors: int = 0,
        nbytes: int = 0,
        unverified: Sequence[str] = (),
    ) -> ScrubResult:
        return ScrubResult(
            checkpoint_id=str(path),
            status=status,
            tensors=tensors,
            bytes=nbytes,
            bad=tuple(bad),
            unverified=tuple(unverified),
            detail=detail,
            seconds=time.monotonic() - start,
        )

    if not is_checkpoint(path):
        return verdict("unreadable", f"no checkpoint at {path} (no DCP {METADATA} file)")
    if not (path / SIDECAR).is_file():
        return verdict("unreadable", f"{path} has no fingerprint record ({SIDECAR}): it cannot be checked")
    try:
        body = read_record(path / SIDECAR, str(path), strict=True)
    except CheckpointError as e:
        return verdict("corrupt", f"the fingerprint record is damaged: {e}", [SIDECAR])
    assert body is not None
    damage = metadata_damage(path, body)
    if damage:
        return verdict("corrupt", damage, [METADATA])
    try:
        from torch.distributed.checkpoint import FileSystemReader

        metadata = FileSystemReader(str(path)).read_metadata()
        storage = metadata.storage_data
    except OSError as e:
        return verdict("unreadable", f"{path / METADATA} cannot be read ({e.strerror or e})")
    except Exception as e:  # a damaged pickle, from before records held the metadata's fingerprint
        return verdict("corrupt", f"its DCP metadata file {METADATA} is damaged ({type(e).__name__})", [METADATA])
    allowed: dict[str, set[str]] = {}
    for key, values in body["fingerprints"].items():
        allowed.setdefault(key.split("#", 1)[0], set()).update(values)
    return _read_items(path, metadata, storage, allowed, progress, verdict)


def _read_at(fd: int, buf: mmap.mmap, offset: int, length: int) -> memoryview:
    """Read ``length`` bytes at ``offset`` into ``buf``; a view of what was read (shorter at the end of the file)."""
    view = memoryview(buf)[:length]
    got = 0
    while got < length:  # in pieces of _READ: one huge read waits for all its pages, pieces keep readahead going
        n = os.preadv(fd, [view[got : got + _READ]], offset + got)
        if not n:
            break
        got += n
    return view[:got]


def _advise(fd: int, what: str) -> None:
    advice = getattr(os, what, None)
    if advice is not None and hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, advice)
        except OSError:
            pass  # advice only


class _ItemCheck:
    """One item's check as its pieces arrive: the raw bytes fingerprinted as they stream past when the item's
    head says they are the tensor's bytes in order, else the whole item collected and decoded."""

    def __init__(self, fqn: str, file: str, offset: int, length: int) -> None:
        self.fqn, self.file, self.offset, self.length = fqn, file, offset, length
        self.head: Head | None = None
        self.stream: StreamingFingerprint | None = None
        self.collected: bytearray | None = None

    def feed(self, at: int, data: memoryview) -> None:
        if at == 0:
            self.head = head(data)
            if self.head is not None and self.head.in_order:
                self.stream = StreamingFingerprint()
            else:
                self.collected = bytearray()
        if self.stream is not None:
            assert self.head is not None
            lo, hi = max(self.head.start, at), min(self.head.start + self.head.nbytes, at + len(data))
            if hi > lo:
                self.stream.update(data[lo - at : hi - at])
        else:
            assert self.collected is not None
            self.collected += data

    def problem(self, path: Path, allowed: dict[str, set[str]]) -> str | None:
        """Why the item does not match (None: it does, or nothing was recorded for its key)."""
        values = allowed.get(self.fqn)
        if self.stream is not None:
            assert self.head is not None
            if values is None or (self.stream.nbytes == self.head.nbytes and f"{self.stream.value:016x}" in values):
                return None
            # The streamed walk is a fast path, never the proof: read the item again and decode it fully.
            with open(path / self.file, "rb") as f:
                f.seek(self.offset)
                self.collected = bytearray(f.read(self.length))
        assert self.collected is not None
        return _check(memoryview(self.collected), self.fqn, allowed)


@dataclass
class _Tally:
    """What a scrub has read so far."""

    bad: list[str]
    notes: list[str]
    unverified: list[str]
    checked: int = 0
    nbytes: int = 0


def _read_file(
    fd: int,
    piece: mmap.mmap,
    path: Path,
    name: str,
    items: list[Any],
    allowed: dict[str, set[str]],
    progress: Progress | None,
    tally: _Tally,
) -> str | None:
    """Read and check the items of one file, in offset order, into ``tally``; why the file cannot be read (None: it
    could)."""
    for index, info in sorted(items, key=lambda ii: ii[1].offset):
        item = _ItemCheck(index.fqn, name, info.offset, info.length)
        at = 0
        while at < info.length:
            want = min(_PIECE, info.length - at)
            try:
                data = _read_at(fd, piece, info.offset + at, want)
            except OSError as e:
                return f"{path / name} cannot be read ({e.strerror or e})"
            tally.nbytes += len(data)
            if progress is not None:
                progress(len(data))
            if len(data) < want:
                tally.bad.append(item.fqn)
                tally.notes.append(f"{name} is truncated ({item.fqn} ends past its end)")
                data.release()
                return None  # a truncated file: nothing after this item is there
            item.feed(at, data)  # while the bytes are still in the CPU's cache
            data.release()
            at += want
        if item.fqn in allowed:
            tally.checked += 1
        else:  # read (a damaged encoding still shows), but there is nothing to compare it with
            tally.unverified.append(item.fqn)
        problem = item.problem(path, allowed)
        if problem is not None:
            tally.bad.append(item.fqn)
            tally.notes.append(problem)
    return None


def _read_items(
    path: Path,
    metadata: Any,
    storage: dict[Any, Any],
    allowed: dict[str, set[str]],
    progress: Progress | None,
    verdict: Callable[..., ScrubResult],
) -> ScrubResult:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    tensors = {k for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    per_file: dict[str, list[Any]] = {}
    tally = _Tally(bad=[], notes=[], unverified=[])
    for index, info in storage.items():
        if index.fqn not in tensors:
            continue
        if info.transform_descriptors:  # the stored bytes are not the tensor's: nothing to compare
            tally.unverified.append(index.fqn)
            continue
        per_file.setdefault(info.relative_path, []).append((index, info))
    piece = mmap.mmap(-1, _PIECE)  # the one buffer: the memory a scrub needs does not grow with the checkpoint
    try:
        for name in sorted(per_file):
            try:
                fd = os.open(path / name, os.O_RDONLY)
            except OSError as e:
                return verdict(
                    "unreadable",
                    f"{path / name} cannot be read ({e.strerror or e})",
                    tensors=tally.checked,
                    nbytes=tally.nbytes,
                )
            try:
                # Drop the file's clean cached pages first: the bytes checked come from the storage, not from a
                # copy in memory that would hide rot on the disk. Dropped again after: the scrub leaves the cache.
                _advise(fd, "POSIX_FADV_DONTNEED")
                _advise(fd, "POSIX_FADV_SEQUENTIAL")
                failed = _read_file(fd, piece, path, name, per_file[name], allowed, progress, tally)
                if failed is not None:
                    return verdict("unreadable", failed, tensors=tally.checked, nbytes=tally.nbytes)
                _advise(fd, "POSIX_FADV_DONTNEED")
            finally:
                os.close(fd)
    finally:
        piece.close()
    bad, notes, checked, nbytes = tally.bad, tally.notes, tally.checked, tally.nbytes
    missing = sorted(set(allowed) - {i.fqn for i in storage})
    if missing:
        bad += missing
        notes.append(f"{len(missing)} fingerprinted tensor(s) absent from DCP's index: {', '.join(missing[:5])}")
    bad, unverified = sorted(set(bad)), sorted(set(tally.unverified))
    if unverified:
        notes.append(
            f"{len(unverified)} saved tensor(s) could not be compared (no recorded fingerprint, or saved with "
            f"transforms): {_names(unverified)}"
        )
    if bad:
        return verdict(
            "corrupt",
            f"{len(bad)} tensor(s) differ from what was saved: {_names(bad)} ({'; '.join(notes[:3])})",
            bad,
            checked,
            nbytes,
            unverified,
        )
    return verdict("unverified" if unverified else "clean", "; ".join(notes[:3]), (), checked, nbytes, unverified)


def _names(keys: Sequence[str]) -> str:
    return ", ".join(keys[:8]) + (" ..." if len(keys) > 8 else "")


def _check(data: memoryview, fqn: str, allowed: dict[str, set[str]]) -> str | None:
    """Why the stored bytes of one whole item do not match (None: they do, or nothing was recorded for its key)."""
    import torch

    tensor = view_tensor(data)
    if tensor is None:  # a layout the in-place reader does not handle: torch.load copies it out
        try:
            tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as e:
            return f"{fqn}: its stored bytes cannot be decoded ({type(e).__name__})"
    values = allowed.get(fqn)
    if values is None:
        return None
    found = f"{fingerprint_many([tensor])[0]:016x}"
    del tensor  # the view must not outlive the buffer
    return None if found in values else f"{fqn}: fingerprint {found} is not the one recorded"


def latest_good(
    root: str | os.PathLike[str], *, store: str | os.PathLike[str] | None = None, progress: Progress | None = None
) -> tuple[Path | None, list[ScrubResult]]:
    """The newest checkpoint under ``root`` (or the fleet store's record of verified checkpoints there) that is
    verified and still scrubs clean, and the verdicts of those tried (newest first). Reads every candidate it
    tries in full: call it on one process (e.g. the launcher) and pass the path to every rank's ``load``."""
    from .dcp import store_candidates

    root = Path(root)
    found = store_candidates(store, root) if store is not None else candidates(root)
    tried: list[ScrubResult] = []
    for c in found:
        if c.problem or c.verified is not True:
            continue
        result = scrub_one(c.path, progress=progress)
        tried.append(result)
        if result.status == "clean":
            return c.path, tried
    return None, tried
