#!/usr/bin/env bash
# The demo (`make demo`): a 4-node Ray cluster on the local SLURM testbed, started by raystack,
# used through plain `ray job submit`, inspected, and taken down.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export RAYSTACK_HOME=${RAYSTACK_HOME:-/var/lib/raystack-testbed/home/demo}   # shared by every node
NODES=${NODES:-4}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
step "SLURM sees $NODES nodes with 4 GPUs each"
sinfo -N -o '%N %t %c %G'

step "raystack up --nodes $NODES --profile testbed --name demo"
raystack down demo >/dev/null 2>&1 || true
raystack up --nodes "$NODES" --profile testbed --name demo

step "raystack status"
raystack status demo

step 'eval "$(raystack env demo)"; ray job submit -- python hello.py'
eval "$(raystack env demo)"
ray job submit --working-dir jobs/debug --runtime-env-json '{"env_vars": {"RAYSTACK_EXPECT_NODES": "'"$NODES"'", "RAYSTACK_EXPECT_GPUS": "'"$((NODES * 4))"'"}}' \
    -- python hello.py 2>&1 | grep -v '^\s*$' | grep -vE 'INFO (dashboard_sdk|packaging|sdk)\.py'

step "raystack down"
raystack down demo
step "done: logs of the allocation and of every node are in $RAYSTACK_HOME/clusters/demo/logs"
ls "$RAYSTACK_HOME/clusters/demo/logs"
