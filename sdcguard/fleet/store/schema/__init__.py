"""The fleet store's schema: :mod:`.migrations` lists every step of both backends; :mod:`.tables`,
:mod:`.tally_tables` and :mod:`.checkpoints` hold the steps' SQL by the tables they change."""
