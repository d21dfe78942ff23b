"""``python -m sdcguard`` is the ``sdcguard`` command."""

from .cli import main

main()
