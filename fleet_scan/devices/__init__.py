"""This machine's devices as the scanner sees them: which there are and which a scan was asked for
(:mod:`.discovery`), whether a job is using one and the lock that keeps two scanners apart (:mod:`.idle`), and
their telemetry before and after a scan (:mod:`.telemetry`)."""
