"""The documented import paths of the framework adapters: ``sdcguard.adapters.lightning`` and
``sdcguard.adapters.hf``. They live in :mod:`sdcguard.training.adapters`; these modules re-export them.
"""
