"""Where the training guard finds the fleet store: ``from sdcguard.store import Store``.

The store lives in :mod:`sdcguard.fleet.store`; this module only keeps the training side's import path working
until it imports ``sdcguard.fleet.store`` (or ``sdcguard.Store``) itself.
"""

from __future__ import annotations

from .fleet.store import Store

__all__ = ["Store"]
