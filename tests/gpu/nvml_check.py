"""raystack/allocation/node/gpus.py on real GPUs: NVML's answers against nvidia-smi's, and what each costs.

A child process holds 1 GiB on every GPU (torch); then the same questions go to NVML and to
nvidia-smi: the processes holding GPU memory (the child's pid and about 1 GiB on each GPU), this
process's descendants among them, and each GPU's used/total memory. Exit 0 only if they agree.
Needs torch, psutil and nvidia-ml-py (no Ray: gpus.py is loaded on its own):
    pip install --no-deps --target /tmp/nv nvidia_ml_py-*.whl psutil-*.whl
    PYTHONPATH=/tmp/nv python3 tests/gpu/nvml_check.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpus", REPO / "raystack" / "allocation" / "gpus.py")
assert spec and spec.loader
gpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpus)

HOLD = (
    "import sys, time, torch\n"
    "n = torch.cuda.device_count()\n"
    "xs = [torch.empty(2**30, dtype=torch.uint8, device=f'cuda:{i}') for i in range(n)]\n"
    "torch.cuda.synchronize(); print('held', flush=True); sys.stdin.read()\n"
)


def timed(fn, n: int = 20) -> tuple[object, float]:
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        took.append(time.perf_counter() - t0)
    return out, statistics.median(took)


def main() -> int:
    assert gpus.nvml() is not None, "NVML did not load"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout and child.stdout.readline().strip() == "held"
    time.sleep(1)
    nvml_apps, nvml_s = timed(gpus.compute_apps)
    mine = gpus.gpu_processes()
    nvml_rows, nvml_rows_s = timed(gpus.nvml_rows)
    apps_query = "--query-compute-apps=pid,used_memory"
    smi = gpus.smi(apps_query)
    smi_apps, smi_s = timed(lambda: gpus.parse_compute_apps(gpus.smi(apps_query)), 5)
    smi_rows, smi_rows_s = timed(gpus.smi_rows, 5)
    child.stdin.close()  # type: ignore[union-attr]
    child.wait()
    time.sleep(1)
    after = gpus.gpu_processes()
    ngpu = len(nvml_rows)  # type: ignore[arg-type]
    child_rows = [m for p, m in nvml_apps if p == child.pid]  # type: ignore[union-attr]
    checks = {
        "NVML lists the child once per GPU, about 1 GiB each": len(child_rows) == ngpu
        and all(1024 <= m <= 1024 + 1024 for m in child_rows),
        "NVML and nvidia-smi list the same (pid, MiB)": sorted(nvml_apps) == sorted(smi_apps),  # type: ignore[arg-type]
        "gpu_processes() finds the child among this process's descendants": {p for p, _ in mine}
        == {child.pid},
        "nothing held once the child exited": after == [],
        "NVML and nvidia-smi agree on each GPU's uuid and total memory": [r[1] for r in nvml_rows]  # type: ignore[union-attr]
        == [r[1] for r in smi_rows]  # type: ignore[union-attr]
        and [r[4] for r in nvml_rows] == [r[4] for r in smi_rows],  # type: ignore[union-attr]
    }
    figures = {
        "gpus": ngpu,
        "nvml_apps": nvml_apps,
        "smi_apps_text": smi,
        "compute_apps_s": {"nvml": round(nvml_s, 6), "nvidia-smi": round(smi_s, 4)},
        "usage_rows_s": {"nvml": round(nvml_rows_s, 6), "nvidia-smi": round(smi_rows_s, 4)},
    }
    for k, v in checks.items():
        print(f"{k:<70} {'yes' if v else 'NO'}")
    result = {"benchmark": "nvml_check", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "figures": figures, "checks": checks}  # fmt: skip
    print(json.dumps(result))
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "nvml_check.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
