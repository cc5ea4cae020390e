"""What the GPUs of this node hold and do: through NVIDIA's management library (NVML, the
nvidia-ml-py binding) where it loads, else one nvidia-smi call per question.

NVML answers in well under a millisecond from this process; nvidia-smi is a program of its own
that takes 50-300 ms of a core each time. So a node with NVML checks its GPUs four times as
often (CHECK_EVERY), and the queue runner waits that much less after a job's end before it may
start the next one (drain.gpu_memory_held).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
from types import ModuleType

CHECK_EVERY = {"nvml": 0.25, "nvidia-smi": 1.0}  # seconds between a node's GPU checks


@functools.cache
def nvml() -> ModuleType | None:
    """pynvml, initialised once per process; None without the binding or the driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return pynvml


@functools.cache
def real_gpus() -> bool:
    """Real GPUs can be inspected here (looked up once per process)."""
    return nvml() is not None or shutil.which("nvidia-smi") is not None


def source() -> str | None:
    """How this node asks its GPUs: 'nvml', 'nvidia-smi', or None (no real GPUs)."""
    return "nvml" if nvml() is not None else "nvidia-smi" if real_gpus() else None


def gpu_processes(root: int | None = None) -> list[tuple[int, int]]:
    """(pid, MiB) of processes descended from this node program (or process `root`) that hold
    GPU memory.

    We are the subreaper of everything our Ray started, so orphans (vLLM's leftovers) count too.
    Empty without real GPUs.
    """
    import psutil

    apps = compute_apps()
    if not apps:
        return []
    try:
        ours = {p.pid for p in psutil.Process(root).children(recursive=True)}
    except psutil.Error:
        return []
    return [(pid, mib) for pid, mib in apps if pid in ours]


def compute_apps() -> list[tuple[int, int]]:
    """(pid, MiB) of every process holding memory on a GPU of this machine (one row per GPU it
    holds). A size the driver does not give (MIG, another container's process) counts as 0."""
    nv = nvml()
    if nv is not None:
        found = []
        try:
            for index in range(nv.nvmlDeviceGetCount()):
                for proc in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(index)):
                    used = proc.usedGpuMemory
                    found.append((int(proc.pid), used // 2**20 if isinstance(used, int) else 0))
        except nv.NVMLError:
            return []
        return found
    return parse_compute_apps(smi("--query-compute-apps=pid,used_memory")) if real_gpus() else []


def smi(query: str) -> str:
    """nvidia-smi's CSV answer to one `--query-...=` (empty where it fails)."""
    try:
        return subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return ""


def parse_compute_apps(out: str) -> list[tuple[int, int]]:
    """`nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits` as (pid,
    MiB). A field nvidia-smi cannot fill reads `[N/A]` (MIG GPUs: the memory of every process)
    or `[Insufficient Permissions]`: such a process counts with 0 MiB, never as an error."""
    found = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 2 or not fields[0].isdigit():
            continue
        found.append((int(fields[0]), int(fields[1]) if fields[1].isdigit() else 0))
    return found


def gpu_usage(visible: str | None = None) -> list[tuple[float, float, float]]:
    """(utilisation %, memory used MiB, memory total MiB) of each GPU of this node's allocation.

    `visible`: CUDA_VISIBLE_DEVICES as SLURM set it (indices or UUIDs): where the driver shows
    more GPUs than that (no device cgroup), only those count. Empty without real GPUs."""
    rows = nvml_rows() if nvml() is not None else smi_rows() if real_gpus() else []
    wanted = {v.strip() for v in (visible or "").split(",") if v.strip()}
    if wanted and len(rows) > len(wanted):
        rows = [r for r in rows if r[0] in wanted or r[1] in wanted]
    usage = []
    for _index, _uuid, util, used, total in rows:
        with contextlib.suppress(ValueError):  # "[N/A]" on some boards
            usage.append((float(util), float(used), float(total)))
    return usage


def nvml_rows() -> list[list[str]]:
    """index, uuid, utilisation %, used MiB, total MiB of each GPU, as nvidia-smi's query writes them."""
    nv = nvml()
    assert nv is not None
    rows = []
    try:
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            memory = nv.nvmlDeviceGetMemoryInfo(handle)
            try:
                util = str(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
            except nv.NVMLError:  # (MIG instances have no utilisation of their own)
                util = "[N/A]"
            uuid = nv.nvmlDeviceGetUUID(handle)
            rows.append([str(index), uuid, util, str(memory.used // 2**20), str(memory.total // 2**20)])
    except nv.NVMLError:
        return []
    return rows


def smi_rows() -> list[list[str]]:
    out = smi("--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total")
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.count(",") == 4]


def memory_activity() -> list[tuple[float, set[int]]]:
    """(memory utilisation %, pids holding it) of each GPU of this machine: the share of the last
    sample period in which the GPU read or wrote its memory (NVML), and who computes on it. Empty
    without real GPUs; a GPU whose utilisation the driver does not give (MIG) is left out."""
    nv = nvml()
    found = []
    if nv is not None:
        try:
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                with contextlib.suppress(nv.NVMLError):
                    util = float(nv.nvmlDeviceGetUtilizationRates(handle).memory)
                    holders = {int(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)}
                    found.append((util, holders))
        except nv.NVMLError:
            return []
        return found
    if not real_gpus():
        return []
    holders_of: dict[str, set[int]] = {}
    for line in smi("--query-compute-apps=pid,gpu_uuid").splitlines():
        pid, _, uuid = (f.strip() for f in line.partition(","))
        if pid.isdigit():
            holders_of.setdefault(uuid, set()).add(int(pid))
    for line in smi("--query-gpu=uuid,utilization.memory").splitlines():
        uuid, _, share = (f.strip() for f in line.partition(","))
        with contextlib.suppress(ValueError):  # ("[N/A]")
            found.append((float(share), holders_of.get(uuid, set())))
    return found


def process_memory_activity(pids: set[int], since: float) -> float | None:
    """The highest memory utilisation (%) NVML sampled for any of `pids` since `since` (epoch
    seconds) on any GPU: what one job's processes did, not their neighbours' on a shared GPU. None
    where NVML gives no per-process samples (no binding, an old driver, MIG): then read the GPU."""
    nv = nvml()
    if nv is None:
        return None
    found, known = 0.0, False
    try:
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                samples = nv.nvmlDeviceGetProcessUtilization(
                    nv.nvmlDeviceGetHandleByIndex(index), int(since * 1e6)
                )
            except nv.NVMLError_NotFound:  # (no process sampled since then: it did nothing there)
                known = True
                continue
            known = True
            found = max([found, *(float(s.memUtil) for s in samples if int(s.pid) in pids)])
    except (nv.NVMLError, AttributeError):
        return None
    return found if known else None
