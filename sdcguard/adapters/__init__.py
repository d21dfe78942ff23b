"""Framework adapters: thin layers over :class:`sdcguard.guard.SDCGuard` for Lightning and Hugging Face.

Import the one you need (``sdcguard.adapters.lightning`` or ``sdcguard.adapters.hf``); each imports its framework.
"""
