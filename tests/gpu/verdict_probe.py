"""The hang verdict's evidence on a GPU without Ray (issue 64): the node program's progress probe
(raystack/allocation/watchdog/progress.py) on the hang corpus's one-process GPU cases (tests/hangs), read as
the watchdog reads it with hang_timeout 30 s. The healthy cases side by side (the torch loop and HF
Trainer 3 minutes, the others 100 s), then the GPU flag poll alone. For each: every move's time and
evidence, the longest quiet stretch (start line -> first move, between moves, last -> end; over
30 s would be a false hang), and for a hung one when it would be called hung. It needs only
psutil, py-spy and nvidia-ml-py beside the machine's torch and transformers: one run, no staging.

Here:  python tests/gpu/verdict_probe.py prepare      # the three wheels into .stage/verdict/
There: run with carry [".stage/verdict"]:  python3 tests/gpu/verdict_probe.py   (about 5 minutes;
       $OUT/verdict.json and one log per case)
The full path, through a local cluster and the watchdog: FAULTS=corpus bash tests/gpu/run.sh --only faults."""

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT", "/tmp/out"))
SITE = Path("/tmp/vsite")
if not (SITE / "psutil").exists():
    for whl in (REPO / ".stage" / "verdict").glob("*.whl"):
        zipfile.ZipFile(whl).extractall(SITE)
    for spy in SITE.glob("*.data/scripts/py-spy"):
        spy.chmod(0o755)
        (SITE / "bin").mkdir(exist_ok=True)
        (SITE / "bin" / "py-spy").unlink(missing_ok=True)
        (SITE / "bin" / "py-spy").symlink_to(spy)
sys.path[:0] = [str(SITE), str(REPO)]
os.environ["PATH"] = f"{SITE}/bin:" + os.environ["PATH"]
os.environ["RAYSTACK_HOME"] = tempfile.mkdtemp()

from raystack.allocation.node import gpus  # noqa: E402
from raystack.allocation.watchdog.progress import JobProgress, ProgressProbe  # noqa: E402

HANG = 30.0
SCALE = float(os.environ.get("SCALE", "1"))
HEALTHY = {
    "torch_item": 180,
    "torch_item_toplevel": 100,
    "torch_nosync": 100,
    "hf_trainer": 180,
    "matmul_chain": 100,
    "checkpoint_write": 100,
}
HUNG = {"gpu_flag_poll": 80}
if os.environ.get("ONLY"):
    HEALTHY = {k: v for k, v in HEALTHY.items() if k in os.environ["ONLY"].split(",")}
HERE = REPO / "tests" / "hangs"


def stamp(text: str, what: str, start: float) -> float | None:
    """When a corpus program printed its `CORPUS <what>` line, in seconds after `start`."""
    found = [ln for ln in text.splitlines() if ln.startswith(f"CORPUS {what}")]
    return float(found[0].split("t=")[1]) - start if found else None


def run(cases: dict[str, float], healthy: bool) -> dict:
    probe = ProgressProbe("verdict", "gpu")
    procs, logs = {}, {}
    for name, secs in cases.items():
        env = {
            **os.environ,
            "RAYSTACK_JOB_ID": name,
            "CORPUS_SECONDS": str(secs * SCALE),
            "CORPUS_DEVICE": "auto",
            "PYTHONPATH": str(HERE),
        }
        logs[name] = open(OUT / f"{name}.log", "w")  # noqa: SIM115 (closed with the run)
        procs[name] = subprocess.Popen(
            [sys.executable, f"{name}.py"], cwd=HERE, env=env, stdout=logs[name], stderr=subprocess.STDOUT
        )
        probe.jobs[name] = JobProgress(HANG / 6)
    start = time.time()
    moves = {n: [] for n in cases}
    last = {n: 0.0 for n in cases}
    limit = max(cases.values()) * SCALE + (120 if healthy else 0)
    while time.time() - start < limit and any(p.poll() is None for p in procs.values()):
        for name, p in probe.jobs.items():
            if procs[name].poll() is None and p.due <= probe.clock.now():
                probe.sample(name)
                if p.moved != last[name]:
                    last[name] = p.moved
                    moves[name].append((round(p.moved - start, 1), p.why))
        time.sleep(0.2)
    end = time.time()
    result = {}
    for name, proc in procs.items():
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        text = (OUT / f"{name}.log").read_text()
        t0, t1 = stamp(text, "start", start), stamp(text, "done", start)
        times = [t for t, _ in moves[name] if t0 is None or t >= t0]
        edges = [t0 or 0.0, *times, (t1 if t1 is not None else end - start)]
        gap = max(b - a for a, b in itertools.pairwise(edges))
        row = {
            "rc": proc.returncode,
            "start": t0,
            "done": t1,
            "moves": len(times),
            "longest_quiet_s": round(gap, 1),
            "evidence": sorted({w for _, w in moves[name]}),
            "tail": text.splitlines()[-3:],
        }
        if healthy:
            row["would_be_called_hung"] = gap > HANG
        else:
            late = [t for t in times if t0 is not None and t > t0 + 10]
            row["moves_after_10s"] = len(late)
            row["hung_at_s_after_start"] = round((times[-1] if times else t0 or 0) + HANG - (t0 or 0), 1)
        row["moves_sample"] = moves[name] if len(moves[name]) <= 9 else moves[name][:6] + moves[name][-3:]
        result[name] = row
    return result


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    if sys.argv[1:] == ["prepare"]:
        platforms = [f"--platform={p}" for p in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "any")]
        wheels = ["py-spy", "psutil", "nvidia-ml-py"]
        args = ["download", "-d", str(REPO / ".stage" / "verdict"), "--only-binary=:all:", *platforms]
        sys.exit(subprocess.call([sys.executable, "-m", "pip", *args, "--python-version", "3.12", *wheels]))
    report = {"source": gpus.source()}
    report["healthy"] = run(HEALTHY, True)
    print(json.dumps(report["healthy"], indent=1), flush=True)
    report["hung"] = run(HUNG, False)
    print(json.dumps(report["hung"], indent=1), flush=True)
    (OUT / "verdict.json").write_text(json.dumps(report, indent=1))
