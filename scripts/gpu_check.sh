#!/usr/bin/env bash
# The one prepared run of every CUDA path of sdcguard: one section per part, each in its own process under its
# own time limit, each ending PASS, FAIL or SKIP with a reason, then a summary line. The limits add up to 8 minutes.
# Everything measured goes to one folder: results.json, gpu_check.log and intrinsics-<arch>.json.
# The sections and what each proves: scripts/gpu_check/sections.py and the README ("GPU check").
#
#   scripts/gpu_check.sh                     # every section; results in $OUT, else gpu_check_out/
#   scripts/gpu_check.sh --dry-run           # no GPU step: proves the script, its files and its summary (CI)
#   scripts/gpu_check.sh --only fingerprint,training --out /tmp/gc
#   scripts/gpu_check.sh --fetch-wheels      # here, where pip works: the wheels a bare device machine lacks
#   scripts/gpu_check.sh --promote A.json B.json   # intrinsics goldens from candidates of two devices
#
# Python: $PYTHON, else .venv/bin/python, else python3 (the device machine's, which has torch and cupy). Run from a
# source tree: no install is needed, the tree goes on PYTHONPATH. A package the interpreter lacks (the store's
# sqlite-utils on the device machine) is installed from .whl/ into a temporary folder when .whl/ is there.
# Exit status: 0 no section failed, 1 a section failed, 2 bad arguments.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# The wheels a bare CUDA image lacks (pure Python): the fleet store's sqlite-utils and what it needs beyond click,
# pluggy, python-dateutil, tabulate and pip, which such images carry.
WHEELS=(sqlite-utils==4.2.1 sqlite-fts4==1.0.3 click-default-group==1.2.4)

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "gpu_check: $*" >&2; exit 2; }

dry=(); out=${OUT:-$ROOT/gpu_check_out}; only=(); mode=run; files=()
while (($#)); do
    case $1 in
        --dry-run) dry=(--dry-run) ;;
        --out) (($# > 1)) || die "--out needs a folder"; out=$2; shift ;;
        --only) (($# > 1)) || die "--only needs section names, e.g. --only scan,drill"; only=(--only "$2"); shift ;;
        --fetch-wheels) mode=fetch ;;
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

if [[ $mode == fetch ]]; then
    # Python 3.12 is the device image's; the wheels are pure Python, so any platform tag matches.
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$ROOT/.whl" "${WHEELS[@]}"
fi
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
    site=""
    trap '[[ -n $site ]] && rm -rf "$site"' EXIT  # run_all is a subshell (a pipeline): this is its own exit
    if ! "$PY" -c 'import sqlite_utils' 2>/dev/null && compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
        site=$(mktemp -d /tmp/gpu_check_site.XXXXXX)
        echo "installing $(ls "$ROOT"/.whl/*.whl | wc -l) carried wheel(s) from .whl/ into $site"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$ROOT"/.whl/*.whl \
            && export PYTHONPATH="$PYTHONPATH:$site"
    fi
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
