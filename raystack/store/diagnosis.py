"""What a stuck or failed distributed job's evidence says, in one line: which ranks sit in which
collective, which never arrived, and what PyTorch's flight recorder saw.

Two kinds of evidence, both in logs/jobs/<id>/:
  stacks/<host>-<pid>.txt   one process's `py-spy dump` (allocation/watchdog/stacks.py), after a header
                            line `# pid 820 rank 0/2 python: <command>` (rank when it has one)
  flight/rank_<r>           torch's flight recorder of rank r (a pickle of plain data: its last
                            collectives per process group, with their sequence numbers and states),
                            written when torch's NCCL watchdog times out (TORCH_NCCL_DUMP_ON_TIMEOUT)
                            or when raystack asks for it (TORCH_NCCL_DEBUG_INFO_PIPE_FILE)
Pure reading; nothing here runs or changes a job.
"""

from __future__ import annotations

import io
import pickle
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = re.compile(r"^# pid (\d+)(?: rank (\d+)/(\d+|\?))? (.*?): (.*)$")
THREAD = re.compile(r'^Thread (\S+) \(([\w+]+)\)(?:: "(.*)")?$')  # (no name where py-spy cannot read it)
FRAME = re.compile(r"^\s+(.+?) \((.+?)(?::(\d+))?\)$")
# torch.distributed's collectives and point-to-point calls as their Python frames are named
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
    "all_to_all", "all_to_all_single", "reduce", "gather", "scatter", "send", "recv", "isend",
    "irecv", "batch_isend_irecv", "all_reduce_coalesced", "gather_object", "scatter_object_list",
    "new_group", "init_process_group", "wait",
}  # fmt: skip
GPU_WAITS = ("synchronize",)  # torch.cuda.synchronize, Event/Stream.synchronize
NATIVE_GPU = re.compile(r"^(cu\w*Synchronize\w*|cuda\w*Synchronize|cuMemcpy\w*|cudaMemcpy\w*)$")
NATIVE_NCCL = re.compile(r"^(nccl\w+)$")
NOTE = 100  # characters of py-spy's reason for no stack, in a one-line cause
MOST = 6  # parts of a summary (ranks or processes in one place): the rest is in the stacks
LIBRARY = re.compile(r"(site-packages|dist-packages|/lib/python3[\d.]*/|^<frozen |^threading\.py$|^\w+\.py$)")


@dataclass
class Frame:
    name: str
    file: str
    line: int | None

    @property
    def python(self) -> bool:
        return self.line is not None

    def place(self) -> str:
        return f"{self.name} ({Path(self.file).name}:{self.line})" if self.python else self.name


@dataclass
class Process:
    """One process's dump: who it is and its threads' frames (innermost first)."""

    host: str
    pid: int
    rank: int | None
    world: int | None
    name: str
    command: str
    threads: list[tuple[str, str, list[Frame]]] = field(default_factory=list)  # (name, state, frames)
    note: str = ""  # why there is no stack (py-spy's error), where the dump says

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"{self.name} pid {self.pid} on {self.host}"


def parse_dump(text: str, host: str = "?") -> Process | None:
    """One stacks/<host>-<pid>.txt file; None when it has no header."""
    lines = text.splitlines()
    head = HEADER.match(lines[0]) if lines else None
    if head is None:
        return None
    rank = int(head[2]) if head[2] is not None else None
    world = int(head[3]) if head[3] is not None and head[3].isdigit() else None
    proc = Process(host, int(head[1]), rank, world, head[4].strip(), head[5])
    for line in lines[1:]:
        if m := THREAD.match(line):
            name = m[3] if m[3] is not None else "MainThread" if m[1] == str(proc.pid) else ""
            proc.threads.append((name, m[2], []))  # (the main thread's OS id is the pid)
        elif proc.threads and (m := FRAME.match(line)):
            proc.threads[-1][2].append(Frame(m[1], m[2], int(m[3]) if m[3] else None))
        elif not proc.threads and not proc.note and line.strip():
            proc.note = line.strip().removeprefix("[py-spy: ").removesuffix("]")
    return proc


def is_library(file: str) -> bool:
    """A frame's file belongs to the standard library or an installed package (py-spy gives full
    paths with --full-filenames, which raystack's dumps use; else the part after sys.path)."""
    if file.startswith("/"):
        return bool(LIBRARY.search(file))
    if "/" in file:
        return True  # (a package's module, shortened: torch/cuda/__init__.py)
    return file.removesuffix(".py") in sys.stdlib_module_names or file.startswith("<")


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost Python frame of the job's own code (not the standard library or a package)."""
    for f in frames:
        if f.python and not is_library(f.file):
            return f
    return next((f for f in frames if f.python), None)


def state_of(proc: Process) -> tuple[str, str]:
    """(kind, words) of where a process's main thread is: ('collective', 'all_reduce at
    train.py:20'), ('nccl', ...) inside NCCL, ('gpu', ...) waiting for its GPU, or ('other',
    'asleep in <module> (train.py:17)')."""
    main = next((t for t in proc.threads if t[0] == "MainThread"), proc.threads[0] if proc.threads else None)
    if main is None:
        why = proc.note.splitlines()[0][:NOTE] if proc.note else ""
        return "unknown", f"no Python stack: {why}" if why else "no Python stack"
    frames = main[2]
    mine = user_frame(frames)
    at = f" at {Path(mine.file).name}:{mine.line}" if mine else ""
    python = [f for f in frames if f.python]
    native = [f for f in frames if not f.python]
    for f in python:
        if "torch/distributed" in f.file and f.name.split(".")[-1] in COLLECTIVES:
            return "collective", f"{f.name.split('.')[-1]}{at}"
    for f in native:
        if NATIVE_NCCL.match(f.name):
            return "nccl", f"{f.name}{at}"
    for f in python:
        if "torch/cuda" in f.file and f.name.split(".")[-1] in GPU_WAITS:
            return "gpu", f"waits for the GPU (torch.cuda.{f.name}){at}"
    for f in reversed(native):  # (the outermost: the CUDA call the code made)
        if NATIVE_GPU.match(f.name):
            return "gpu", f"waits for the GPU ({f.name}){at}"
    state = "running" if "active" in main[1] else "asleep"
    if not python:
        return "other", f"{state} outside Python"
    top = python[0]
    return "other", f"{state} in {top.place() if mine is None or top is mine else top.name + at}"


def read_dumps(folder: Path, since: float = 0.0) -> list[Process]:
    """Every process dump in a job's stacks/ folder written at or after `since`, by rank then host."""
    found = []
    for path in sorted(folder.glob("*.txt")) if folder.is_dir() else []:
        try:
            if path.stat().st_mtime < since:
                continue
            text = path.read_text(errors="replace")
        except OSError:
            continue
        host = path.name.rsplit("-", 1)[0]
        proc = parse_dump(text, host)
        if proc is not None:
            found.append(proc)
    return sorted(found, key=lambda p: (p.rank is None, p.rank or 0, p.host, p.pid))


def idle_worker(proc: Process) -> bool:
    """Ray's own processes of a job that hold no clue: its job supervisor, a worker between tasks
    (its main thread waits for the next one in Ray's main loop)."""
    if proc.name.startswith(("ray::JobSupervisor", "ray::IDLE")):
        return True
    main = next((t for t in proc.threads if t[0] == "MainThread"), None)
    return (
        main is not None
        and bool(main[2])
        and main[2][0].name.endswith("main_loop")
        and "ray/" in main[2][0].file
    )


def stacks_summary(procs: list[Process], most: int = MOST) -> str:
    """`rank 0 waits in all_reduce at train.py:20; rank 1 never arrived (asleep in <module>
    (train.py:17))` for the ranks (or the processes, where there are no ranks, but Ray's idle
    ones); ranks that are in the same place are said once; at most `most` parts."""
    ranked = [p for p in procs if p.rank is not None] or [p for p in procs if not idle_worker(p)]
    states = [(p, *state_of(p)) for p in ranked]
    waiting = any(kind in ("collective", "gpu", "nccl") for _, kind, _ in states)
    by_text: dict[str, list[Process]] = {}
    for p, kind, words in states:
        if kind == "collective":
            text = f"waits in {words}"
        elif kind == "nccl":
            text = f"inside NCCL ({words})"
        elif kind != "gpu" and waiting and p.rank is not None:
            text = f"never arrived ({words})"
        else:
            text = words
        by_text.setdefault(text, []).append(p)
    parts = []
    for text, who in by_text.items():
        ranks = [p.rank for p in who if p.rank is not None]
        if len(ranks) == len(who):
            parts.append(f"{_ranks(ranks)} {text.replace('waits ', 'wait ', 1) if len(ranks) > 1 else text}")
        else:
            parts.extend(f"{p.label} {text}" for p in who)
    more = f"; and {len(parts) - most} more (the stacks)" if len(parts) > most else ""
    return "; ".join(parts[:most]) + more


# ---------------------------------------------------------------------------- the flight recorder
class _PlainData(pickle.Unpickler):
    """A flight recorder dump is plain data (dicts, lists, strings, numbers): nothing else loads."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} in a flight recorder dump: not plain data")


def read_flight(folder: Path, since: float = 0.0) -> dict[int, dict[str, Any]]:
    """{rank: dump} of the flight recorder files rank_<r> in `folder` written at or after `since`."""
    found: dict[int, dict[str, Any]] = {}
    for path in sorted(folder.glob("rank_*")) if folder.is_dir() else []:
        tail = path.name.removeprefix("rank_")
        if not tail.isdigit():
            continue
        try:
            if path.stat().st_mtime < since:
                continue
            data = _PlainData(io.BytesIO(path.read_bytes())).load()
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError):
            continue
        if isinstance(data, dict):
            found[int(tail)] = data
    return found


def _op(dump: dict[str, Any], pg: str, seq: int) -> str:
    for entry in dump.get("entries") or []:
        if str(entry.get("pg_id")) == pg and entry.get("collective_seq_id") == seq:
            return str(entry.get("profiling_name") or "?").removeprefix("nccl:").removeprefix("gloo:")
    return "?"


def flight_summary(dumps: dict[int, dict[str, Any]]) -> str:
    """What the flight recorders show, per process group where the ranks disagree: `flight recorder:
    ranks 0 at all_reduce #2 (not completed); rank 1 behind, last at #1`. '' when nothing stands out."""
    if not dumps:
        return ""
    groups: dict[str, dict[int, tuple[int, int]]] = {}
    for rank, dump in dumps.items():
        for pg, status in (dump.get("pg_status") or {}).items():
            if isinstance(status, dict):
                enq = int(status.get("last_enqueued_collective", -1))
                done = int(status.get("last_completed_collective", -1))
                groups.setdefault(str(pg), {})[rank] = (enq, done)
    parts = []
    for pg, ranks in sorted(groups.items()):
        top = max(enq for enq, _ in ranks.values())
        ahead = sorted(r for r, (enq, done) in ranks.items() if enq == top and done < top)
        behind = sorted(r for r, (enq, _) in ranks.items() if enq < top)
        if not ahead and not behind:
            continue
        desc = _pg_name(dumps, pg)
        op = _op(dumps[ahead[0] if ahead else min(ranks)], pg, top)
        words = []
        if ahead:
            words.append(f"{_ranks(ahead)} at {op} #{top} (not completed)")
        for r in behind:
            last = ranks[r][0]
            words.append(
                f"rank {r} never reached it (last collective #{last})"
                if last >= 0
                else f"rank {r} never reached it (no collective yet)"
            )
        parts.append(f"{desc}: " + "; ".join(words) if desc else "; ".join(words))
    missing = ""
    worlds = [len(_pg_ranks(d, "0")) for d in dumps.values() if _pg_ranks(d, "0")]
    if worlds and max(worlds) > len(dumps):
        absent = sorted(set(range(max(worlds))) - set(dumps))
        missing = f"; no dump from {_ranks(absent)}"
    return f"flight recorder: {'; '.join(parts)}{missing}" if parts else ""


def _pg_name(dumps: dict[int, dict[str, Any]], pg: str) -> str:
    for dump in dumps.values():
        conf = (dump.get("pg_config") or {}).get(pg) or {}
        if conf.get("desc") and conf.get("desc") != "default_pg":
            return f"group {conf['desc']}"
    return ""


def _pg_ranks(dump: dict[str, Any], pg: str) -> list[int]:
    text = str(((dump.get("pg_config") or {}).get(pg) or {}).get("ranks") or "")
    return [int(n) for n in re.findall(r"\d+", text)]


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def diagnose(job_dir: Path, since: float = 0.0) -> str:
    """The line `raystack stacks` and a hung job's message give: the flight recorder first (it
    counts collectives; the stacks show only where each process is), then the stacks."""
    words = [
        flight_summary(read_flight(job_dir / "flight", since)),
        stacks_summary(read_dumps(job_dir / "stacks", since)),
    ]
    return "; ".join(w for w in words if w)
