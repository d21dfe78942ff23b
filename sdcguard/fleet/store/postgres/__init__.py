"""The fleet store on a PostgreSQL server: :mod:`.connection` (opening, transactions, advisory locks),
:mod:`.dialect` (the store's one SQL text as PostgreSQL reads it), :mod:`.schema` (the tables, derived from
SQLite's), :mod:`.transfer` (a SQLite merge input copied in) and :mod:`.roles` (least-privilege roles for scan
nodes, jobs and readers). Imported only for a ``postgresql://`` store:
psycopg is an optional dependency (the ``postgres`` extra)."""
