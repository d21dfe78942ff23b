#!/usr/bin/env bash
# bash examples/fleet.sh
# The fleet side on this machine, as two nodes and the fleet would run it (deploy/ has the cron, Slurm and
# Kubernetes versions): each "node" scans a CPU core into its own store, the merge job collects the node stores into
# the fleet store, the fleet policy decides, and the report shows each device. Node b also runs a fire drill that
# makes its core faulty: the drill's results go to node b's drill store, never into the fleet's record, and the
# drill stores merge into the fleet's drill store, where the policy quarantines the core (`report --drills`). Everything lands in ./sdcguard-example-fleet (replaced on each run). Uses the
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

step "node b: the same on core 1, then a fire drill that makes the core flip a bit in every output"
"$sdcguard" --db "$dir/nodes/node-b.db" scan --device cpu:1 --all --budget 3 --policy-scope node >/dev/null
echo "exit $? (0: every execution passed)" >&2
"$sdcguard" --db "$dir/nodes/node-b.db" scan --device cpu:1 --all --budget 3 --policy-scope node \
    --inject 'cpu:1:bitflip,rate=1.0' >/dev/null
echo "exit $? (1: corruption found; the retest reproduced it; recorded in nodes/node-b.drills.db)" >&2

step "merge the node stores into the fleet store (the drill store left out), then the fleet's policy"
"$sdcguard" merge "$dir/fleet.db" "$dir/nodes"
"$sdcguard" --db "$dir/fleet.db" policy
echo "exit $? (0: nothing to quarantine: a drill is not a failure)" >&2

step "the drills into the fleet's drill store, and its policy"
"$sdcguard" merge "$dir/fleet.drills.db" "$dir/nodes/node-b.drills.db"
"$sdcguard" --db "$dir/fleet.drills.db" policy
echo "exit $? (1: the drill's core quarantined, in the drill store only)" >&2

step "the report and the quarantine list"
"$sdcguard" --db "$dir/fleet.db" report
"$sdcguard" --db "$dir/fleet.db" quarantine list
"$sdcguard" --db "$dir/fleet.db" report --drills
"$sdcguard" --db "$dir/fleet.db" report --format json > "$dir/report.json"
"$sdcguard" --db "$dir/fleet.db" report --drills --format json > "$dir/drills.json"
python3 - "$dir/report.json" "$dir/drills.json" <<'PY'
import json, sys
rows = {r["device"]: r["status"] for r in json.load(open(sys.argv[1]))}
drills = {r["device"]: r["status"] for r in json.load(open(sys.argv[2]))}
print(f"report: {rows}")
print(f"drills: {drills}")
healthy = len(rows) == 2 and all(s == "healthy" for s in rows.values())
drilled = [d for d, s in drills.items() if d.endswith(":1") and s == "quarantined"]
sys.exit(0 if healthy and drilled else 1)
PY
