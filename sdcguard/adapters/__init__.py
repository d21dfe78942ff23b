"""Framework adapters: thin layers over :class:`sdcguard.SDCGuard` for Lightning (:mod:`.lightning`) and Hugging Face
(:mod:`.hf`). Import the one you need (``sdcguard.adapters.lightning`` or ``sdcguard.adapters.hf``); each imports its
framework. They belong to the training side (they import only :mod:`sdcguard.training` and the core).
"""
