#!/usr/bin/env bash
# A per-node wrapper around a training job guarded with on_detect="exit": restart from the checkpoint the guard
# names (the incident's rollback) without the node whose device was named. Run on every node, e.g. under srun:
#   srun --ntasks-per-node=1 deploy/slurm/sdcguard-train.sh train.py --steps 100000
# train.py calls sdcguard.checkpoint.load(state, checkpoint_id=args.resume) when --resume is given. The ranks of a
# suspect node exit 86 and append their incidents to $SDCGUARD_SUSPECT_FILE; the others exit 85 (restart me).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 TRAIN.py [ARGS...]" >&2; exit 2; }
export SDCGUARD_SUSPECT_FILE=${SDCGUARD_SUSPECT_FILE:-/var/run/sdcguard.suspect}
export SDCGUARD_DB=${SDCGUARD_DB:-/shared/sdcguard/jobs/${SLURM_JOB_ID:-local}.db}
resume=""
while [ ! -e "$SDCGUARD_SUSPECT_FILE" ]; do        # a node whose device was named stops here
  torchrun --nnodes=2:8 --rdzv-backend=c10d --rdzv-endpoint="${HEAD:-localhost}:29400" --max-restarts=0 \
      "$@" --resume "$resume" && break
  resume=$(sdcguard incidents --since 1d --format json |
           python3 -c 'import json, sys; print(next((i["rollback"] for i in reversed(json.load(sys.stdin)) if i.get("rollback")), ""))')
done
