#!/usr/bin/env bash
# raystack's GPU code paths on one GPU machine that has no SLURM (the `device` machine): the node
# program runs as a one-node allocation (SLURM's four commands are stood in by tests/gpu/shims),
# then the real queue runner runs hello, allreduce (NCCL, one actor per GPU) and zero3 (DeepSpeed
# ZeRO-3 on CUDA, one learner per GPU), and tests/gpu/check.py verifies what came back.
#   PYTHONPATH=<ray and deps> bash tests/gpu/run.sh      (see tests/gpu/README.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/tests/gpu/shims:$PATH" PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
export RAYSTACK_HOME=/tmp/rs RAYSTACK_CLUSTER=gpu RAY_USAGE_STATS_ENABLED=0
ngpu=$(nvidia-smi -L | wc -l)
export SLURM_JOB_ID=1 SLURM_NODEID=0 SLURM_JOB_NUM_NODES=1 SLURM_JOB_NODELIST="$(hostname -s)"
export SLURM_GPUS_ON_NODE=$ngpu SLURM_CPUS_ON_NODE=16 SLURM_JOB_CPUS_PER_NODE=16
export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((ngpu - 1)))
export RAYSTACK_NODE_IP=${RAYSTACK_NODE_IP:-127.0.0.1} RAYSTACK_OBJECT_STORE_MEMORY=4GB RAYSTACK_JOIN_TIMEOUT=300
mkdir -p "$RAYSTACK_HOME/clusters/gpu/logs"
python3 -m raystack.allocation.node >"$RAYSTACK_HOME/clusters/gpu/logs/node-$(hostname -s).log" 2>&1 &
node=$!
status=0
python3 tests/gpu/check.py "$ngpu" || status=$?
kill -TERM "$node"; wait "$node" || true
tail -5 "$RAYSTACK_HOME/clusters/gpu/logs/node-$(hostname -s).log"
pgrep -f "raylet|gcs_server" >/dev/null && { echo "Ray processes left after teardown"; status=1; }
exit $status
