#!/usr/bin/env bash
# raystack on other Rays: for each version given, a venv with that ray[default] and raystack
# (editable, from this checkout), then a local cluster (token auth), a queued job that joins the
# cluster, plain `ray job submit` and `ray status` configured by `raystack env`, and `down`.
# Prints one line per version and writes bench/results/ray_range.txt.
#   bash bench/ray_range.sh 2.54.0 2.55.1
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=bench/results/ray_range.txt
{
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -n), $(nproc) CPUs, python $(python3 -V | cut -d' ' -f2), raystack $(git rev-parse --short HEAD)"
} > "$out"
for version in "$@"; do
    venv=/tmp/raystack-ray-$version
    [ -x "$venv/bin/raystack" ] || {
        python3 -m venv "$venv" &&
        "$venv/bin/pip" install -q "ray[default]==$version" pyyaml psutil httpx pydantic typer rich pathspec \
            cryptography 'setuptools>=77' 'setuptools-scm>=8' &&
        "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$repo"
    } >/dev/null 2>&1 || { echo "ray $version: install failed" | tee -a "$out"; continue; }
    export RAYSTACK_HOME=/tmp/raystack-range-$version PATH="$venv/bin:$PATH"
    rm -rf "$RAYSTACK_HOME"
    name=r${version//./}
    t0=$(date +%s.%N)
    up=$(raystack up --local --name "$name" 2>&1 | grep -c " READY: ")
    t1=$(date +%s.%N)
    job=$(raystack submit -c "$name" --follow -- python -c 'import ray; ray.init(); print("RAY", ray.__version__)' 2>&1 | grep -o "RAY [0-9.]*")
    eval "$(raystack env "$name")"
    plain=$(ray job submit -- python -c 'print("PLAIN ok")' 2>&1 | grep -c "PLAIN ok")
    status=$(ray status 2>&1 | grep -c "node_")
    raystack down "$name" >/dev/null 2>&1
    ok=$([ "$up" = 1 ] && [ "$job" = "RAY $version" ] && [ "$plain" -ge 1 ] && [ "$status" -ge 1 ] && echo yes || echo NO)
    printf 'ray %-7s up READY in %5.1fs, job saw "%s", plain ray job submit %s, ray status %s: %s\n' \
        "$version" "$(echo "$t1 - $t0" | bc)" "$job" "$plain" "$status" "$ok" | tee -a "$out"
    unset RAY_ADDRESS RAY_AUTH_TOKEN RAY_AUTH_MODE
done
