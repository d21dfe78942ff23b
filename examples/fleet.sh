#!/usr/bin/env bash
# bash examples/fleet.sh
# The fleet side on this machine, as two nodes and the fleet would run it (deploy/ has the cron, Slurm and
# Kubernetes versions): each "node" scans a CPU core into its own store (one of them with a fire drill that makes
# its core faulty), the merge job collects the node stores into the fleet store, the fleet policy decides, and
# the report shows each device. Everything lands in ./sdcguard-example-fleet (replaced on each run). Uses the
# `sdcguard` on PATH, else this checkout's .venv-run or .venv (make run or make setup installs it).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
sdcguard=$(command -v sdcguard || ls "$here"/.venv-run/bin/sdcguard "$here"/.venv/bin/sdcguard 2>/dev/null | head -1)
[ -n "$sdcguard" ] || { echo "no sdcguard: run make run (or make setup) first" >&2; exit 2; }
dir=sdcguard-example-fleet
rm -rf "$dir" && mkdir -p "$dir/nodes"
step() { echo "==> $*" >&2; }

step "node a: scan core 0 for 3 s into its own store (--all: even if the core is busy)"
"$sdcguard" --db "$dir/nodes/node-a.db" scan --device cpu:0 --all --budget 3 --policy-scope node >/dev/null
echo "exit $? (0: every execution passed)" >&2

step "node b: the same on core 1, with a fire drill that makes the core flip a bit in every output"
"$sdcguard" --db "$dir/nodes/node-b.db" scan --device cpu:1 --all --budget 3 --policy-scope node \
    --inject 'cpu:1:bitflip,rate=1.0' >/dev/null
echo "exit $? (1: corruption found; the retest reproduced it)" >&2

step "merge the node stores into the fleet store, then the fleet's policy"
"$sdcguard" merge "$dir/fleet.db" "$dir/nodes"
"$sdcguard" --db "$dir/fleet.db" policy
echo "exit $? (1: it quarantined a device)" >&2

step "the report and the quarantine list"
"$sdcguard" --db "$dir/fleet.db" report
"$sdcguard" --db "$dir/fleet.db" quarantine list
"$sdcguard" --db "$dir/fleet.db" report --format json > "$dir/report.json"
python3 - "$dir/report.json" <<'PY'
import json, sys
rows = {r["device"]: r["status"] for r in json.load(open(sys.argv[1]))}
bad = [d for d, s in rows.items() if d.endswith(":1") and s == "quarantined"]
good = [d for d, s in rows.items() if d.endswith(":0") and s == "healthy"]
print(f"report: {rows}")
sys.exit(0 if bad and good else 1)
PY
