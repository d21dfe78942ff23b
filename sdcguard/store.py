"""The import path the store had before the fleet side moved into :mod:`sdcguard.fleet`: ``from sdcguard.store
import Store`` keeps working for code written against it. New code imports ``sdcguard.Store`` or
:mod:`sdcguard.fleet.store`.
"""

from __future__ import annotations

from .fleet.store import Store

__all__ = ["Store"]
