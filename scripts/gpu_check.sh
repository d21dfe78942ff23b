#!/usr/bin/env bash
# The one prepared run of every CUDA path of sdcguard: one section per part, each in its own process under its
# own time limit, each ending PASS, FAIL or SKIP with a reason, then a summary line. The limits add up to 8 minutes.
# Everything measured goes to one folder: results.json, gpu_check.log and intrinsics-<arch>.json.
# The sections and what each proves: scripts/gpu_check/sections.py and the README ("GPU check").
#
#   scripts/gpu_check.sh                     # every section; results in $OUT, else gpu_check_out/
#   scripts/gpu_check.sh --dry-run           # no GPU step: proves the script, its files and its summary (CI)
#   scripts/gpu_check.sh --only fingerprint,training --out /tmp/gc
#   scripts/gpu_check.sh --promote A.json B.json   # intrinsics goldens from candidates of two devices
#
# Python: $PYTHON, else .venv/bin/python, else python3 (the device machine's, which has torch and cupy). Run from a
# source tree: no install is needed, the tree goes on PYTHONPATH (the fleet store needs only the standard library's
# sqlite3).
# Exit status: 0 no section failed, 1 a section failed, 2 bad arguments.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "gpu_check: $*" >&2; exit 2; }

dry=(); out=${OUT:-$ROOT/gpu_check_out}; only=(); mode=run; files=()
while (($#)); do
    case $1 in
        --dry-run) dry=(--dry-run) ;;
        --out) (($# > 1)) || die "--out needs a folder"; out=$2; shift ;;
        --only) (($# > 1)) || die "--only needs section names, e.g. --only scan,drill"; only=(--only "$2"); shift ;;
        --promote) mode=promote; shift; files=("$@"); break ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done

PY=${PYTHON:-}
if [[ -z $PY ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
command -v "$PY" >/dev/null 2>&1 || die "no Python at $PY (set PYTHON=...)"
export PYTHONPATH="$ROOT:$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if [[ $mode == promote ]]; then
    ((${#files[@]})) || die "--promote needs candidate files (intrinsics-<arch>.json of two devices)"
    exec "$PY" -m gpu_check promote "${files[@]}"
fi

"$PY" -m gpu_check plan "${only[@]}" >/dev/null || exit 2
mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd)
log="$out/gpu_check.log"

run_all() {
    local rc name limit left start=$SECONDS
    timeout -k 5 60 "$PY" -m gpu_check begin --out "$out" "${dry[@]}" || { echo "gpu_check: could not start"; return 2; }
    command -v nvidia-smi >/dev/null 2>&1 && timeout 20 nvidia-smi -L
    local plan total line
    plan=$("$PY" -m gpu_check plan "${only[@]}") || return 2
    total=$(awk '{s += $2} END {print s}' <<<"$plan")
    mapfile -t plan <<<"$plan"
    for line in "${plan[@]}"; do
        read -r name limit <<<"$line"
        left=$((total - (SECONDS - start)))
        if ((left < 5)); then
            "$PY" -m gpu_check finish "$name" --out "$out" --rc 0 --skip-reason "no time left of the run's ${total} s"
            continue
        fi
        ((limit > left)) && limit=$left
        timeout -k 5 "$limit" "$PY" -m gpu_check run "$name" --out "$out" --timeout "$limit" "${dry[@]}" </dev/null
        rc=$?
        "$PY" -m gpu_check finish "$name" --out "$out" --rc "$rc" --timeout "$limit"
    done
    "$PY" -m gpu_check summary --out "$out" "${dry[@]}"
}

run_all 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
