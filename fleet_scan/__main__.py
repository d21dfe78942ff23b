"""``python -m fleet_scan``: the fleet scanner, the same command as ``sdcguard scan`` (options identical)."""

from sdcguard.cli.scan import main

if __name__ == "__main__":
    main()
