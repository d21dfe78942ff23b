#!/bin/bash
# The fleet's half of the policy, on the Slurm controller (cron, daily, after the night's scans):
#
#   17 5 * * *  /opt/sdcguard/deploy/slurm/sdcguard-merge.sh >> /shared/sdcguard/logs/merge.log 2>&1
#
# 1. merge every node's store and every training job's spool (the guard's store=/shared/sdcguard/jobs/JOB.db)
#    into the fleet store (each brings only what is new since its last merge; a directory is every *.db in it);
# 2. apply the fleet's rules (failure rate, circuit breakers across hosts, training incidents, probation) and
#    drain the nodes of the devices they quarantine;
# 3. roll scans older than 30 days into daily counts, so the store stays the size of its window;
# 4. write the Prometheus textfile.
# Exit code: the policy's (1: devices quarantined, 2: a circuit breaker tripped), else the first failing step's.
# /opt/sdcguard: a clone of this repository on the shared file system, with `python3 -m venv .venv &&
# .venv/bin/pip install '.[gpu]'` in it (the scan job uses it too; not `pip install sdcguard`: that is another
# project on PyPI).
set -u
SDC=/opt/sdcguard/.venv/bin/sdcguard
FLEET=/shared/sdcguard/fleet.db
mkdir -p /shared/sdcguard/jobs
"$SDC" merge "$FLEET" /shared/sdcguard/nodes /shared/sdcguard/jobs || exit
# A spool untouched for a week was just merged whole: its incidents live in the fleet store now. (A job that
# records again later recreates its spool: a new store id, merged whole.)
find /shared/sdcguard/jobs -name '*.db' -mtime +7 -delete
"$SDC" --db "$FLEET" policy --config /etc/sdcguard/sdcguard.toml --action slurm-drain
rc=$?
"$SDC" --db "$FLEET" prune --before 30d || exit
"$SDC" --db "$FLEET" export prometheus /var/lib/node_exporter/textfile/sdcguard.prom || exit
exit $rc
