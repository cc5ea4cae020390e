"""The command line of each SPMD launcher on one node, with the rendezvous raystack gives it, and
how to read which rank failed from its output. Pure functions.

  torchrun    --nnodes N --node_rank r --nproc_per_node P --master_addr A --master_port p CMD
  deepspeed   --hostfile H --no_ssh --node_rank r --num_nodes N --num_gpus P --master_addr A
              --master_port p CMD   (H: generated, one line per node: DeepSpeed's world info;
              nothing is reached over ssh)
  accelerate  launch --num_machines N --machine_rank r --num_processes N*P --main_process_ip A
              --main_process_port p [--multi_gpu] CMD
"""

from __future__ import annotations

import re
import shlex
import signal
from dataclasses import dataclass

from raystack.store.workerlogs import EXCEPTION, FATAL

LAUNCHERS = ("torchrun", "deepspeed", "accelerate")


@dataclass(frozen=True)
class Rendezvous:
    """Where the node ranks meet: node 0's address and a free port there."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    hosts: tuple[str, ...]  # every node's host name, by node rank
    gpus: bool = False


def argv(
    launcher: str, rdv: Rendezvous, command: list[str], extra: list[str], hostfile: str = "", logdir: str = ""
) -> list[str]:
    """The launcher's command line on node `rdv.node_rank`; with `logdir`, each rank's output goes
    to files of its own there (rank_log_args), read back line by line by the node's launcher actor."""
    extra = [*rank_log_args(launcher, logdir, extra), *extra] if logdir else extra
    if launcher == "torchrun":
        return [
            "torchrun",
            f"--nnodes={rdv.nnodes}",
            f"--node_rank={rdv.node_rank}",
            f"--nproc_per_node={rdv.nproc_per_node}",
            f"--master_addr={rdv.master_addr}",
            f"--master_port={rdv.master_port}",
            *extra,
            *command,
        ]
    if launcher == "deepspeed":
        return [
            "deepspeed",
            f"--hostfile={hostfile}",
            "--no_ssh",
            f"--node_rank={rdv.node_rank}",
            f"--num_nodes={rdv.nnodes}",
            f"--num_gpus={rdv.nproc_per_node}",
            f"--master_addr={rdv.master_addr}",
            f"--master_port={rdv.master_port}",
            *extra,
            *command,
        ]
    if launcher == "accelerate":
        multi = ["--multi_gpu"] if wants_multi_gpu(rdv, extra) else []
        return [
            "accelerate",
            "launch",
            f"--num_machines={rdv.nnodes}",
            f"--machine_rank={rdv.node_rank}",
            f"--num_processes={rdv.nnodes * rdv.nproc_per_node}",
            f"--main_process_ip={rdv.master_addr}",
            f"--main_process_port={rdv.master_port}",
            *multi,
            *extra,
            *command,
        ]
    raise ValueError(f"unknown launcher {launcher!r}: one of {', '.join(LAUNCHERS)}")


# The launcher options that send each rank's stdout and stderr to its own files: the ranks of a
# node otherwise share one pipe, and a print() written as text and newline (Python unbuffered, as
# Ray runs jobs) glues one rank's partial line to another's. A user's own choice is kept.
_RANK_LOGS = {
    "torchrun": (
        ("--redirects", "-r", "--tee", "-t", "--log-dir", "--log_dir"),
        ["--redirects=3", "--log-dir={d}"],
    ),
    "deepspeed": (("--enable_each_rank_log",), ["--enable_each_rank_log={d}"]),
    "accelerate": (("--tee", "-t", "--log_dir"), ["--tee=3", "--log_dir={d}"]),
}
RANK_FILE = re.compile(r"(?:attempt_\d+/(?P<local>\d+)/(?:stdout|stderr)\.log|_rank(?P<rank>\d+)\.log)$")
CONSOLE_COPY = re.compile(r"^\[\w+?\d+\]:")  # torchrun's --tee copy of a rank's line: [default0]:


def rank_log_args(launcher: str, logdir: str, extra: list[str]) -> list[str]:
    """The launcher's own options that write each rank's output into `logdir`."""
    given, args = _RANK_LOGS[launcher]
    if any(a.split("=", 1)[0] in given for a in extra):
        return []
    return [a.format(d=logdir) for a in args]


def rank_of(path: str, node_rank: int, procs: int) -> int | None:
    """The global rank whose output a file under the log dir holds (torchrun: by local rank,
    DeepSpeed: by global rank), None for another file."""
    match = RANK_FILE.search(path.replace("\\", "/"))
    if not match:
        return None
    if match["rank"] is not None:
        return int(match["rank"])
    return node_rank * procs + int(match["local"])


# An accelerate argument that already says how to distribute: `--multi_gpu` would override it
# (a config file's `distributed_type: DEEPSPEED` turns into plain DDP).
_DISTRIBUTION_ARGS = (
    "--config_file",
    "--use_deepspeed",
    "--use_fsdp",
    "--use_megatron_lm",
    "--multi_gpu",
    "--cpu",
    "--tpu",
)


def wants_multi_gpu(rdv: Rendezvous, extra: list[str]) -> bool:
    """accelerate needs `--multi_gpu` for several GPU processes unless the user's arguments
    already choose a distribution (a config file, DeepSpeed, FSDP, Megatron, CPU)."""
    if not rdv.gpus or rdv.nnodes * rdv.nproc_per_node < 2:
        return False
    return not any(a.split("=", 1)[0] in _DISTRIBUTION_ARGS for a in extra)


def hostfile(rdv: Rendezvous) -> str:
    """DeepSpeed's hostfile: the world it starts (`slots`: processes per node)."""
    return "".join(f"{host} slots={rdv.nproc_per_node}\n" for host in rdv.hosts)


_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_DS_EXIT = re.compile(r"exits with return code = (-?\d+)")
_RANK_TAG = re.compile(r"\[rank(\d+)\]")


def killed_by(code: int) -> str | None:
    """'killed by SIGABRT' for an exit code that is a negative signal number (as subprocess,
    torchrun and Ray report a process a signal ended); None for an exit or an unknown signal."""
    try:
        return f"killed by {signal.Signals(-code).name}" if code < 0 else None
    except ValueError:
        return None


def exit_words(code: int) -> str:
    """How a process ended, for people: torchrun reports a rank killed by a signal as the negative
    signal number (-6 is an abort, e.g. a C++ exception at exit; -9 often the kernel's OOM killer)."""
    how = killed_by(code)
    return f"{code} ({how})" if how else str(code)


def shell_exit_words(code: int) -> str:
    """A shell's exit status, for people: 128+N is signal N (137: SIGKILL, which with no Python
    traceback is most often the kernel's out-of-memory killer)."""
    how = killed_by(128 - code) if 128 < code < 128 + 65 else None
    if how == "killed by SIGKILL":
        how += ", most often the out-of-memory killer"
    return f"{code} ({how})" if how else str(code)


def failure(lines: list[str], code: int) -> tuple[int | None, int]:
    """(global rank, exit code) of the process that failed a launcher, as far as its output
    says: torchrun's (and accelerate's) root cause, DeepSpeed's return code; else the launcher's."""
    text = "\n".join(lines)
    root = _ROOT_CAUSE.search(text)
    if root:
        return int(root.group(1)), int(root.group(2))
    ds = _DS_EXIT.findall(text)
    tags = _RANK_TAG.findall(text)
    rank = int(tags[-1]) if tags else None
    if ds:
        return rank, int(ds[-1])
    return rank, code


TORCH_TAG = re.compile(r"^\[rank\d+\]:\s?")  # torch's own prefix of a rank's error lines (2.11)
NCCL_CODE = re.compile(r"^(nccl[A-Z]\w+)\b")  # ncclInvalidUsage: ..., ncclRemoteError: ...
# What a rank says when another rank (or node) failed first: the echo, not the cause.
NOISE = re.compile(
    r"ncclRemoteError|remote process exited|Connection (closed|reset) by peer|Broken pipe|TCPStore|"
    r"DistNetworkError|Socket Timeout|communicator was aborted|SIGTERM|got signal: 15",
    re.IGNORECASE,
)


def cause(lines: list[str], rank: int | None) -> str:
    """Why rank `rank` failed, from its own lines in a launcher's tail (`[rank3] ...`): the
    exception that ends its traceback, else a line naming a CUDA/NCCL error or a fatal signal;
    NCCL's error code and its 'Last error' line with it. '' when its output says nothing."""
    tag = f"[rank{rank}] "
    own = (
        [TORCH_TAG.sub("", ln[len(tag) :]) for ln in lines if ln.startswith(tag)] if rank is not None else []
    )
    found = ""
    for i, line in enumerate(own):
        if line.startswith("Traceback (most recent call last)"):
            found = next((f for f in own[i + 1 :] if f and not f[0].isspace() and EXCEPTION.match(f)), "")
            if found:
                break
    if not found:
        found = next((ln for ln in own if EXCEPTION.match(ln) or FATAL.search(ln)), "")
    found = short(found.strip())
    codes = [m[1] for ln in own if (m := NCCL_CODE.match(ln)) and m[1] not in found]
    last = [own[i + 1].strip() for i, ln in enumerate(own[:-1]) if ln.strip() == "Last error:"]
    extra = "; ".join(dict.fromkeys([*codes[:1], *last[:1]]))
    return f"{found[:300]}{f' ({extra[:200]})' if extra else ''}" if found else extra[:300]


def short(line: str) -> str:
    """A CUDA out-of-memory line up to how much was asked and how much was free (its advice on
    PYTORCH_CUDA_ALLOC_CONF is in the log); another line as it is."""
    if "CUDA out of memory" in line:
        return ". ".join(line.split(". ")[:3]).rstrip(".") + "."
    return line


def noise(text: str, code: int) -> bool:
    """Whether a failure is most likely the echo of another's (stopped by the launcher, or NCCL or
    the store reporting a peer that went away)."""
    return code in (-15, 143) or bool(NOISE.search(text))


# What argv sets on each launcher's command line, by the spec field that decides it (None: the
# rendezvous raystack makes on node 0). Given again in launcher_args, the launcher would take the
# user's, out of step with the nodes and GPUs Ray gave the job.
SET_HERE: dict[str, dict[str, str | None]] = {
    "torchrun": {
        **dict.fromkeys(("--nnodes",), "nodes"),
        **dict.fromkeys(("--nproc_per_node", "--nproc-per-node"), "procs_per_node"),
        **dict.fromkeys(("--node_rank", "--node-rank", "--master_addr", "--master-addr", "--standalone")),
        **dict.fromkeys(("--master_port", "--master-port", "--rdzv_endpoint", "--rdzv-endpoint")),
        **dict.fromkeys(("--rdzv_backend", "--rdzv-backend")),
    },
    "deepspeed": {
        **dict.fromkeys(("--num_nodes",), "nodes"),
        **dict.fromkeys(("--num_gpus", "--num_accelerators"), "procs_per_node"),
        **dict.fromkeys(("--hostfile", "-H", "--node_rank", "--master_addr", "--master_port", "--include")),
    },
    "accelerate": {
        **dict.fromkeys(("--num_machines",), "nodes"),
        **dict.fromkeys(("--num_processes",), "procs_per_node"),
        **dict.fromkeys(("--machine_rank", "--main_process_ip", "--main_process_port")),
    },
}
NO_PYTHON = ("--no-python", "--no_python")  # the launcher runs the command as it is, not with Python
PYTHON = re.compile(r"python[\d.]*")
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.runner")


def misuse(launcher: str, command: str, launcher_args: list[str]) -> str | None:
    """What an SPMD spec gets wrong that its launcher would take silently: a launcher inside the
    command (each node's launcher would start another: ranks times ranks), `python` first (the
    launcher starts Python itself and would run a script called python), an option raystack
    sets in launcher_args. None when there is nothing to say."""
    for arg in launcher_args:
        flag = arg.split("=", 1)[0]
        if flag in SET_HERE.get(launcher, {}):
            field = SET_HERE[launcher][flag]
            why = f"give {field}: N instead" if field else "raystack makes the rendezvous on node 0"
            return f"launcher_args: {flag} is set by raystack on {launcher}'s command line ({why}); drop it"
    try:
        words = shlex.split(command)
    except ValueError:
        return None  # (the shell says what is wrong with its quoting)
    first = words[0].rsplit("/", 1)[-1] if words else ""
    nested = first if first in LAUNCHERS else None
    if PYTHON.fullmatch(first) and words[1:2] == ["-m"] and words[2:3] and words[2] in LAUNCHER_MODULES:
        nested = shlex.join(words[:3])
    if nested:
        return (
            f"command starts with {nested}: raystack runs {launcher} itself on every node; give the "
            "script and its arguments (command: train.py ...), the launcher's options in "
            "launcher_args, processes per node in procs_per_node"
        )
    if PYTHON.fullmatch(first) and not any(a.split("=", 1)[0] in NO_PYTHON for a in launcher_args):
        rest = words[1:]
        if rest[:1] == ["-m"]:
            module = "--module" if launcher == "deepspeed" else "-m"
            fix = f"command: {shlex.join(rest[1:])} with launcher_args: [{module}]"
        else:
            fix = f"command: {shlex.join(rest) or 'train.py'}"
        return f"command starts with {first}: {launcher} starts Python itself; drop it: {fix}"
    return None
