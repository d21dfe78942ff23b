"""The SQL that runs inside a job's write transaction, shared by the jobs and the migrations: a scan's batch as rows
(:mod:`.results`), the running totals every such write keeps exact (:mod:`.tallies`), and a merge's rows
(:mod:`.merging`). Plain functions of the transaction's connection; no store object."""
