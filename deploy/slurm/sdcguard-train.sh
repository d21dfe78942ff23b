#!/usr/bin/env bash
# A per-node wrapper around a guarded training job (escalate="recover" or "exit") under torchrun. Run on every node,
# e.g. under srun:
#   srun --ntasks-per-node=1 deploy/slurm/sdcguard-train.sh train.py --steps 100000
# `sdcguard launch` sets $SDCGUARD_VERDICT_FILE for the ranks and turns torchrun's exit 1 back into the guard's
# exit-code contract, with no traceback: 86 when a rank of this node left as a suspect (even if the job went on
# without it: the node must be drained), 85 when the job left by the contract (restart it without the suspect
# node). train.py guards with snapshot_dir=$SDCGUARD_SNAPSHOT_DIR and calls guard.restore(fallback=...) at start: a
# restarted job goes on from the newest verified snapshot in host memory its replicas confirm, else from the last
# verified disk checkpoint (--resume: the incident's rollback), and says which.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 TRAIN.py [ARGS...]" >&2; exit 2; }
export SDCGUARD_DB=${SDCGUARD_DB:-/shared/sdcguard/jobs/${SLURM_JOB_ID:-local}.db}
export SDCGUARD_SNAPSHOT_DIR=${SDCGUARD_SNAPSHOT_DIR:-/dev/shm/sdcguard-${SLURM_JOB_ID:-local}}
tries=${SDCGUARD_RESTARTS:-3}
resume=""
while :; do
  sdcguard launch -- torchrun --nnodes=1:8 --rdzv-backend=c10d --rdzv-endpoint="${HEAD:-localhost}:29400" \
      --rdzv-id="${SLURM_JOB_ID:-local}" --max-restarts=0 "$@" --resume "$resume"
  rc=$?
  [ $rc -eq 86 ] && { echo "sdcguard: a device of $(hostname) is suspect: drain this node" >&2; exit 86; }
  [ $rc -eq 85 ] || exit $rc                        # 0 done; anything else is not the guard's to retry
  tries=$((tries - 1)); [ $tries -gt 0 ] || exit 85  # a peer node was named: start again without it
  resume=$(sdcguard incidents --since 1d --format json |
           python3 -c 'import json, sys; print(next((i["rollback"] for i in reversed(json.load(sys.stdin)) if i.get("rollback")), ""))')
done
