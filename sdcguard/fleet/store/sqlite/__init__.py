"""The fleet store in one SQLite file: :mod:`.backend` (the connection and its transactions) and :mod:`.files` (the
file's checks before SQLite touches it, and the URI that only reads it)."""
