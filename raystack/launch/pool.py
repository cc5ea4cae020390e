"""Launch hosts: the SPMD launchers of a job start in Ray workers that are already running.

A `kind: spmd` job's driver used to start one launcher actor per node: a new Ray worker on every
node, which costs seconds (a python, `import ray`, a runtime_env's setup) before torchrun can
start: 4.8 s of an 18 s launch on the testbed, 3.8-4.8 s on an H100 node. So the cluster keeps
one idle, detached `LaunchHost` actor per node (zero CPUs, zero GPUs, niceness 0), made by the
warm-up job during `up` (allocation/head/warmup.py); a driver whose job fits takes them:

* its placement group still reserves every node's CPUs and GPUs (Ray's accounting and the
  queue's are unchanged: nothing else is given them); once placed, the host of each bundle's node
  starts that node's launcher as the launcher actor would have (launch/spmd.py: NodeLauncherImpl);
* the ranks get what Ray would have given a launcher actor of the job: the job's env_vars, its
  working_dir (the package the submit uploaded, read from the GCS and unpacked once per node, as
  the cwd and first on PYTHONPATH), the node's GPUs as CUDA_VISIBLE_DEVICES;
* a launch whose driver stopped asking for LEASE seconds (the driver was killed) is stopped, its
  processes killed, like a launcher actor that died with its job.

A job fits when its runtime_env has nothing else that Ray creates on the nodes (pip, uv, conda,
py_modules, an image: those need Ray's runtime_env agent), its working_dir is a package Ray
uploaded (gcs://), and it takes whole nodes (its processes per node are the node's GPUs). Any
other job, a node without a host (one grown later) or RAYSTACK_SPMD_POOL=0 in the job's
environment: new launcher actors, as before. The driver's first line says which and why.

The head's host also starts the launches of a job as the queue runner submits it, before its
driver runs (`Ahead`, asked through launch/ahead.py), and ends those no driver took.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shlex
import shutil
import socket
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any

from raystack.launch import NODE_TMP_ENV, SECRET_NAMES_ENV
from raystack.launch.node import NodeLauncherImpl
from raystack.launch.process import after_exit
from raystack.launch.start import layout, parse, start_all
from raystack.waiting import REAL, at_most, until

log = logging.getLogger("raystack.spmd")

NAMESPACE = "raystack"
LEASE = 15.0  # seconds without a call from its driver after which a launch is stopped
KEEP = 8  # unpacked working_dir packages kept per node (the newest)
OFF_ENV = "RAYSTACK_SPMD_POOL"
JOIN = 90.0  # seconds the warm-up waits for the allocation's nodes before it makes the hosts
FIT_KEYS = ("env_vars", "working_dir", "config", "excludes")  # what a host can give the ranks
# Launches started at the submit (ahead.py): the requests, the pipe the head's host reads, how long
# a launch waits for its driver, how often the host reads its jobs' status, the placement group's name.
REQUESTS = "spmd-ahead"  # in the head's node-local temp folder: one empty file per submission id
WAKE = "spmd-ahead.wake"
ADOPT = 60.0
WATCH = 0.5
PREFIX = "raystack-spmd-"  # + the submission id
DRIVER = "raystack.launch.spmd"  # (the driver's module in a job's entrypoint)
PINNED = "RAYSTACK_PIN_NODES"  # (spec/submission.py: pinned)


def name_of(node_id: str) -> str:
    """A node's host's name (Dashboard.node_work does not count it as the node's work)."""
    from raystack.adapters.ray import LAUNCH_HOSTS

    return LAUNCH_HOSTS + node_id


def off(env: dict[str, str] | os._Environ[str]) -> bool:
    """Whether the launch hosts are turned off where the cluster runs (RAYSTACK_SPMD_POOL=0)."""
    return env.get(OFF_ENV, "1") == "0"


def unfit(runtime_env: dict[str, Any], procs: int, gpus_per_node: int, env: dict[str, str]) -> str | None:
    """Why a job's launchers cannot start on the launch hosts (None: they can)."""
    if off(env):
        return f"{OFF_ENV}=0"
    other = [k for k, v in runtime_env.items() if v and k not in FIT_KEYS and not k.startswith("_")]
    if other:
        return f"its runtime_env has {', '.join(sorted(other))}"
    wd = runtime_env.get("working_dir")
    if wd and not (str(wd).startswith("gcs://") and str(wd).endswith(".zip")):
        return f"its working_dir {wd} is not a package Ray uploaded"
    if gpus_per_node and procs != gpus_per_node:
        return f"{procs} of a node's {gpus_per_node} GPUs"
    return None


def visible_gpus(base: dict[str, str], count: int) -> str:
    """A whole node's GPUs as Ray numbers them: the node's own CUDA_VISIBLE_DEVICES (SLURM's) if
    set, else 0..count-1."""
    own = [g for g in base.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return ",".join((own or [str(i) for i in range(count)])[:count])


class LaunchHost:
    """One node's host: starts and follows the launchers of the jobs that come to it (one
    NodeLauncherImpl per launch, called through `call`)."""

    def __init__(self) -> None:
        import ray

        own = (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
        # (what the job that made it added, the warm-up's or a driver's, is not the next job's)
        self.base = {k: v for k, v in os.environ.items() if k not in own}
        self.launches: dict[str, Any] = {}
        self.title: dict[str, float] = {}
        self.lock = threading.Lock()
        # (node-local: the unpacked working_dirs; in the node's temp folder, which the node program
        # removes at the cluster's end: the watcher below dies with the allocation's processes)
        self.root = tempfile.mkdtemp(prefix="rs-pool-", dir=os.environ.get(NODE_TMP_ENV) or None)
        self.unpacking = threading.Lock()  # (not `lock`: the other launches' calls go on meanwhile)
        after_exit(f"rm -rf {shlex.quote(self.root)}")
        threading.Thread(target=self._reap, daemon=True).start()
        self.ahead: Ahead | None = None  # (the head's: it starts an SPMD job's launchers at its submit)
        if os.environ.get(NODE_TMP_ENV):
            with contextlib.suppress(OSError):
                self.ahead = Ahead(os.environ[NODE_TMP_ENV])

    def ready(self) -> str:
        return socket.gethostname()

    def open(self, key: str, node_rank: int, gpus: int, working_dir: str | None) -> dict[str, Any]:
        """A new launch of node `node_rank` holding `gpus` of it: where it runs (launch/spmd.py's
        `where`)."""
        workdir = self._unpack(working_dir) if working_dir else None
        launcher = NodeLauncherImpl(node_rank, base=self.base, workdir=workdir)
        if gpus:
            launcher.gpus = visible_gpus(self.base, gpus).split(",")
        with self.lock:
            self.launches[key], self.title[key] = launcher, time.monotonic()
        return launcher.place()

    def call(self, key: str, method: str, *args: Any) -> Any:
        with self.lock:
            launcher = self.launches[key]
            self.title[key] = time.monotonic()
        return getattr(launcher, method)(*args)

    def keep(self, key: str) -> None:
        """A launch started ahead, kept for the driver that has not come yet (launch/ahead.py)."""
        with self.lock:
            if key in self.title:
                self.title[key] = time.monotonic()

    def adopt(self, sid: str) -> dict[str, Any] | None:
        return self.ahead.adopt(sid) if self.ahead is not None else None

    def release(self, sid: str) -> None:
        if self.ahead is not None:
            self.ahead.end(sid)

    def close(self, key: str) -> None:
        """The driver is done with a launch: stopped if it still runs, its rank logs removed."""
        with self.lock:
            launcher = self.launches.pop(key, None)
            self.title.pop(key, None)
        if launcher is not None:
            launcher.stop(2.0)
            shutil.rmtree(launcher.logdir, ignore_errors=True)

    def _reap(self) -> None:
        def once() -> None:
            now = time.monotonic()
            with self.lock:
                late = [k for k, t in self.title.items() if now - t > LEASE]
            for key in late:  # (its driver is gone: killed, or its job stopped hard)
                self.close(key)

        until(once, 1.0)  # (for the host's life)

    def _unpack(self, uri: str) -> str:
        """The working_dir package `uri` unpacked on this node (once; the KEEP newest are kept)."""
        from ray.experimental.internal_kv import _internal_kv_get

        folder = os.path.join(self.root, uri.rsplit("/", 1)[-1].removesuffix(".zip"))
        with self.unpacking:
            if os.path.isdir(folder):
                os.utime(folder)
                return folder
            data = _internal_kv_get(uri)
            if data is None:
                raise FileNotFoundError(f"the job's working_dir package {uri} is not in Ray's GCS")
            part = tempfile.mkdtemp(dir=self.root)
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                archive.extractall(part)
            os.rename(part, folder)
            kept = sorted((os.path.join(self.root, n) for n in os.listdir(self.root)), key=os.path.getmtime)
            for old in kept[:-KEEP]:
                shutil.rmtree(old, ignore_errors=True)
        return folder


class Pooled:
    """One node's launch on its host, called as a launcher actor is: `.poll.remote()`."""

    def __init__(self, host: Any, key: str):
        self.host, self.key = host, key

    def __getattr__(self, method: str) -> Any:
        return _Method(self, method)

    def close(self) -> Any:
        return self.host.close.remote(self.key)


class _Method:
    """`pooled.poll`: its `.remote(*args)` calls the launch's method on its host."""

    def __init__(self, launch: Pooled, name: str):
        self.launch, self.name = launch, name

    def remote(self, *args: Any) -> Any:
        return self.launch.host.call.remote(self.launch.key, self.name, *args)


@dataclass
class Launch:
    begun: float = field(default_factory=time.monotonic)
    ready: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    pg: Any = None
    adopted: bool = False


class Ahead:
    """On the head's launch host: starts the launches the queue runner asks for as it submits
    their jobs (ahead.py) and ends what no driver took."""

    def __init__(self, node_tmp: str):
        from raystack.store.files import listen

        self.folder = os.path.join(node_tmp, REQUESTS)
        self.launches: dict[str, Launch] = {}
        self.lock = threading.Lock()
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        if listen(os.path.join(node_tmp, WAKE), self.scan, "spmd-ahead"):
            threading.Thread(
                target=until, args=(self.watch, WATCH), name="spmd-ahead-watch", daemon=True
            ).start()

    def scan(self) -> None:
        """Every request in the folder taken (known, then its file removed) and started."""
        with contextlib.suppress(OSError):
            for sid in os.listdir(self.folder):
                with self.lock:
                    new = sid not in self.launches
                    if new:
                        self.launches[sid] = Launch()
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.folder, sid))
                if new:
                    threading.Thread(
                        target=self._start, args=(sid,), name=f"ahead-{sid}", daemon=True
                    ).start()

    def _start(self, sid: str) -> None:
        launch = self.launches[sid]
        try:
            launch.result = self._launch(sid, launch)
        except Exception as exc:
            log.warning("job %s: its launchers were not started ahead: %s", sid, exc)
            self.end(sid)
        finally:
            launch.ready.set()

    def _launch(self, sid: str, launch: Launch) -> dict[str, Any] | None:
        import ray
        from ray.util.placement_group import placement_group

        info = job_info(sid)
        words = shlex.split(info.entrypoint) if info is not None else []
        if DRIVER not in words or info.status.is_terminal():
            return None
        ns = parse(words[words.index(DRIVER) + 1 :])
        renv = dict(info.runtime_env or {})
        env = {str(k): str(v) for k, v in (renv.get("env_vars") or {}).items()}
        fits = layout(ns, ray.nodes())
        if isinstance(fits, str) or env.get(SECRET_NAMES_ENV) or env.get(PINNED):
            return None
        nodes, procs, gpus, bundle = fits
        if unfit(renv, procs, gpus, {**os.environ, **env}) is not None:
            return None
        launch.pg = placement_group(
            [bundle] * nodes, strategy="STRICT_SPREAD", name=PREFIX + sid, lifetime="detached"
        )
        hosts_placed = placed(launch.pg, ADOPT)
        opened = open_all(hosts_placed, f"{sid}-ahead", procs if gpus else 0, renv.get("working_dir"), ADOPT)
        if not isinstance(opened, tuple):
            raise RuntimeError(f"no launch host on {len(opened)} of its nodes")
        actors, places = opened
        commands = start_all(actors, places, ns, procs, bool(gpus), env)
        after = time.monotonic() - launch.begun
        how = f"on the cluster's launch hosts, started at the submit ({after:.2f}s after the runner asked)"
        hosts, keys = [a.host for a in actors], [a.key for a in actors]
        return {
            "hosts": hosts,
            "keys": keys,
            "places": places,
            "commands": commands,
            "fits": list(fits),
            "how": how,
        }

    def adopt(self, sid: str) -> dict[str, Any] | None:
        self.scan()  # (a request not read yet: the driver came first)
        with self.lock:
            launch = self.launches.get(sid)
        if launch is None or not launch.ready.wait(ADOPT):
            return None
        with self.lock:
            launch.adopted = launch.result is not None and sid in self.launches
            return launch.result if launch.adopted else None

    def watch(self) -> None:
        """Each launch not adopted kept alive until its driver comes; what no driver will take
        (its job ended in Ray, or ADOPT seconds passed) ended."""
        try:
            self._watch()
        except Exception as exc:  # (Ray's GCS busy or restarting: the next pass asks again)
            log.warning("the launches started ahead were not checked: %s", exc)

    def _watch(self) -> None:
        with self.lock:
            current = [(sid, launch) for sid, launch in self.launches.items() if launch.ready.is_set()]
        for sid, launch in current:
            info = job_info(sid)
            gone = info is None or info.status.is_terminal()
            if gone or (not launch.adopted and time.monotonic() - launch.begun > ADOPT):
                self.end(sid)
            elif not launch.adopted and launch.result:
                for h, k in zip(launch.result["hosts"], launch.result["keys"], strict=True):
                    h.keep.remote(k)

    def end(self, sid: str) -> None:
        """Its launches stopped and its placement group removed (what is left of them)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        with self.lock:
            launch = self.launches.pop(sid, None)
        if launch is None:
            return
        if launch.result:
            with contextlib.suppress(Exception):
                ray.get(
                    [
                        h.close.remote(k)
                        for h, k in zip(launch.result["hosts"], launch.result["keys"], strict=True)
                    ],
                    timeout=30,
                )
        if launch.pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(launch.pg)


def job_info(sid: str) -> Any:
    """Ray's record of submitted job `sid` (its JobInfo: status, entrypoint, runtime_env), or None."""
    from ray._private import ray_constants
    from ray.dashboard.modules.job.common import JobInfo, JobInfoStorageClient
    from ray.experimental.internal_kv import _internal_kv_get

    data = _internal_kv_get(
        JobInfoStorageClient.JOB_DATA_KEY.format(job_id=sid), namespace=ray_constants.KV_NAMESPACE_JOB
    )
    return JobInfo.from_json(json.loads(data)) if data else None


def options(node_id: str) -> dict[str, Any]:
    """A host's actor options: detached, on its node, taking nothing of it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {
        "name": name_of(node_id),
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "get_if_exists": True,
        "num_cpus": 0,
        "max_concurrency": 64,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
        # (its ranks would inherit Ray's worker niceness 15; and the node's GPUs stay visible)
        "runtime_env": {
            "env_vars": {"RAY_worker_niceness": "0", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
        },
    }


def make(node_ids: list[str]) -> list[Any]:
    """Each node's host, made where missing (`get_if_exists`: one per node however many ask)."""
    import ray

    cls: Any = ray.remote(LaunchHost)
    return [cls.options(**options(n)).remote() for n in node_ids]


def find(node_ids: list[str]) -> dict[str, Any]:
    """The hosts that exist among these nodes' (node id -> handle)."""
    import ray

    found = {}
    for node in dict.fromkeys(node_ids):
        with contextlib.suppress(ValueError):
            found[node] = ray.get_actor(name_of(node), namespace=NAMESPACE)
    return found


def open_all(
    hosts_placed: list[str], key: str, gpus: int, working_dir: str | None, timeout: float = 600
) -> tuple[list[Pooled], list[dict[str, Any]]] | list[str]:
    """A launch (`key`-<node rank>) opened on the host of each of the job's nodes `where`, holding
    `gpus` of it, and where each runs; or the nodes that have no host (nothing opened)."""
    import ray

    found = find(hosts_placed)
    missing = [n for n in hosts_placed if n not in found]
    if missing:
        return missing
    pooled = [Pooled(found[n], f"{key}-{r}") for r, n in enumerate(hosts_placed)]
    opened = [p.host.open.remote(p.key, r, gpus, working_dir) for r, p in enumerate(pooled)]
    return pooled, ray.get(opened, timeout=timeout)


def placed(pg: Any, timeout: float) -> list[str]:
    """The node of each bundle once the placement group is placed. (Not `pg.ready()`: that runs a
    task in it, which would start a worker, the cost this module avoids.)"""
    from ray.util import placement_group_table

    def step() -> list[str] | None:
        table = placement_group_table(pg)
        if table.get("state") != "CREATED":
            return None
        nodes = table.get("bundles_to_node_id") or {}
        return [str(nodes[i]) for i in sorted(nodes)]

    def late() -> BaseException:
        return TimeoutError(f"the job's placement group was not placed in {timeout:.0f}s")

    return until(step, 0.01, REAL, timeout, late)


def main(args: list[str] | None = None) -> int:
    """`python -m raystack.launch.pool [--nodes N]`: a host on every alive node once N are alive
    (at most JOIN seconds; the warm-up job runs it while the allocation's nodes join)."""
    import argparse

    import ray

    parser = argparse.ArgumentParser(prog="python -m raystack.launch.pool")
    parser.add_argument("--nodes", type=int, default=1)
    nodes_wanted = parser.parse_args(args).nodes
    if off(os.environ):
        print(f"raystack: no launch hosts ({OFF_ENV}=0)", flush=True)
        return 0
    t0 = time.monotonic()
    ray.init()

    def alive() -> list[str]:
        return [n["NodeID"] for n in ray.nodes() if n["Alive"]]

    at_most(lambda: True if len(alive()) >= nodes_wanted else None, 0.2, REAL, JOIN)
    hosts = make(alive())
    # NOTE: not until every host is up: READY waits for this job, and on nodes whose cores are
    # few the hosts' workers took seconds to start (4.3 s of the testbed's READY at 4 nodes). A
    # job that comes sooner queues its call until its host is up. Only until the GCS has each
    # one to create: a detached actor whose creation never left this driver would never start.
    until(lambda: True if all(created(h) for h in hosts) else None, 0.05, REAL, 120)
    print(f"raystack: launch hosts on {len(hosts)} node(s) in {time.monotonic() - t0:.1f}s", flush=True)
    return 0


def created(host: Any) -> bool:
    """Whether the GCS is creating a host or has created it (its creation left the driver)."""
    from ray._private import state

    try:
        info = state.actors(actor_id=host._actor_id.hex())
    except Exception:  # (a Ray without this table: wait for the host itself)
        import ray

        return bool(ray.get(host.ready.remote(), timeout=120))
    return str((info or {}).get("State", "")).upper() in ("PENDING_CREATION", "ALIVE")


if __name__ == "__main__":
    raise SystemExit(main())
