#!/usr/bin/env bash
# The GPU suite, one command on a GPU machine (no SLURM needed): a `raystack up --local` cluster
# runs hello, allreduce (NCCL), zero3 (CUDA), grpo_tiny (vLLM where staged; NCCL weight sync), the
# SPMD torchrun job and the placement check back to back, then measures each figure beside its
# baseline in the same run (tests/gpu/suite.py says which), stops the cluster and checks that
# nothing is left holding a GPU. Results: bench/results/gpu_suite.{json,txt} (and $OUT/ if set).
#   bash tests/gpu/run.sh
# Ray and DeepSpeed must be importable (on a machine without network: shared/GPU.md's wheels,
# installed under /tmp/site; this script puts /tmp/site on the paths when it exists).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -d /tmp/site ]; then
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
    # A pip runtime_env's virtualenv (Ray clones the python's venv, or makes one on its system
    # site) must find Ray without PYTHONPATH, as where Ray is installed: a .pth names the stage.
    site=$(python3 -c 'import site; print(site.getsitepackages()[0])') && echo /tmp/site > "$site/raystack-stage.pth"
fi
# The frameworks (TRL, verl, verl's transformers pin) where stage.py --set frameworks put them.
if [ -d /tmp/site-frameworks ]; then
    export PYTHONPATH="/tmp/site-frameworks${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site-frameworks/bin:$PATH"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# (GPU_SUITE_KEEP=1: one home for every run, where the kept cluster lives)
home=/tmp/rs-gpu-$$
[ "${GPU_SUITE_KEEP:-}" = 1 ] && home=/tmp/rs-gpu-kept
export RAYSTACK_HOME="${RAYSTACK_HOME:-$home}" RAY_USAGE_STATS_ENABLED=0
# vLLM 0.22 samples through flashinfer by default; tests/gpu/stage.py does not stage it.
python3 -c 'import flashinfer' 2>/dev/null || export VLLM_USE_FLASHINFER_SAMPLER=0
exec python3 tests/gpu/suite.py "$@"
