"""Shared helpers for the golden-suite tests: a private copy of the golden data, byte flips, bit-flip hooks."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sdcguard.resources import golden_dir

REPO_GOLDEN = golden_dir()


def copy_golden(dst: Path) -> Path:
    """A private copy of the repository's golden data (tests may damage it)."""
    target = dst / "golden"
    shutil.copytree(REPO_GOLDEN, target)
    return target


def golden_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def flip_byte(path: Path, offset: int, mask: int = 0xFF) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= mask
    path.write_bytes(bytes(data))


def rewrite_manifest_hashes(directory: Path) -> None:
    """Make the manifest agree with the files on disk again (what a careless editor would do after a change)."""
    mpath = directory / "manifest.json"
    manifest = json.loads(mpath.read_bytes())
    for rel in manifest["files"]:
        manifest["files"][rel] = hashlib.sha256((directory / rel).read_bytes()).hexdigest()
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}

    def canonical(obj: object) -> bytes:
        return (json.dumps(obj, sort_keys=True, indent=1, separators=(",", ": ")) + "\n").encode()

    manifest["manifest_sha256"] = hashlib.sha256(canonical(body)).hexdigest()
    mpath.write_bytes(canonical(manifest))


def bit_flip_hook(case_id: str, element: int, bit: int) -> Callable[[str, np.ndarray], np.ndarray]:
    """A hook flipping ``bit`` of flat element ``element`` in a copy of ``case_id``'s output."""

    def hook(cid: str, out: np.ndarray) -> np.ndarray:
        if cid != case_id:
            return out
        bad = out.copy()
        u = bad.reshape(-1).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[out.dtype.itemsize])
        u[element] ^= u.dtype.type(1) << u.dtype.type(bit)
        return bad

    return hook
