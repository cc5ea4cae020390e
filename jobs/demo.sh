#!/usr/bin/env bash
# The demo (`make demo`): one allocation on the local SLURM testbed runs a persistent Ray cluster;
# three debug jobs and a tiny real GRPO run (vLLM engines + DeepSpeed ZeRO-3 learners, its layout
# from the planner) are queued while it is still starting and run one after another; then down.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export RAYSTACK_HOME=${RAYSTACK_HOME:-/var/lib/raystack-testbed/home/demo}   # shared by every node
NODES=${NODES:-4}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
step "SLURM sees $NODES nodes with 4 GPUs each"
sinfo -N -o '%N %t %c %G'

step "raystack up --nodes $NODES --profile testbed --name demo --no-wait   (one sbatch)"
raystack down demo >/dev/null 2>&1 || true
raystack up --nodes "$NODES" --profile testbed --name demo --no-wait
rm -rf "$RAYSTACK_HOME/grpo_tiny"   # a fresh run, not the resume of an earlier demo

step "queue hello, allreduce, zero3 and grpo_tiny while the allocation is still starting"
for job in hello allreduce zero3; do raystack submit --cluster demo "jobs/debug/$job.yaml"; done
raystack submit --cluster demo jobs/grpo_tiny/grpo_tiny.yaml \
    --set "entrypoint=python grpo_tiny.py {plan.flags} --steps 15 --learner-cpus-per-gpu 1" \
    --set "outputs.checkpoints=$RAYSTACK_HOME/grpo_tiny"
raystack queue demo

step "raystack wait demo   (every node, GPU and the Jobs API up; no fixed sleeps)"
raystack wait demo

step "the jobs run one after another (raystack logs <id> -f follows each)"
for id in $(raystack queue demo --json | python3 -c 'import json,sys; print(" ".join(j["id"] for j in json.load(sys.stdin)))'); do
    echo "--- $id"
    raystack logs "$id" -f | grep -E '^(node[0-9]|host |all-reduce|step [0-9]+:|grpo_tiny: |GRPO_STEP)' \
        | sed -E 's/, "checksum_learner.*//' || true
done

step "raystack queue demo"
raystack queue demo
step "raystack status demo"
raystack status demo

step "plain ray job submit still works (eval \"\$(raystack env demo)\")"
eval "$(raystack env demo)"
ray job submit --working-dir jobs/debug -- python hello.py 2>&1 | grep -E '^(node[0-9]|host )' || true

step "raystack down demo"
raystack down demo
step "done: ledger and logs outlive the allocation in $RAYSTACK_HOME/clusters/demo"
ls "$RAYSTACK_HOME/clusters/demo" "$RAYSTACK_HOME/clusters/demo/logs/jobs"
failed=$(raystack queue demo --json | python3 -c 'import json,sys; print(sum(j["state"] != "SUCCEEDED" for j in json.load(sys.stdin)))')
[ "$failed" = 0 ] || { echo "demo: $failed job(s) did not succeed" >&2; exit 1; }
