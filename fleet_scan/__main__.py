"""``python -m fleet_scan``: the fleet scanner, the same command as ``sdcguard scan`` (options identical)."""

from .command import main

if __name__ == "__main__":
    main()
