"""What a job's driver asks (entrypoint_memory) against what a node of the cluster gives Ray:
refused before it is queued."""

from __future__ import annotations

from pathlib import Path

import pytest

from raystack.errors import ConfigError
from raystack.spec.job import JobSpec
from raystack.spec.load import command_spec
from raystack.spec.resolve import resolve
from raystack.store.cluster import ClusterRecord

CLUSTER = ClusterRecord(name="c", nodes_expected=1, gpus_per_node=0, cpus_per_node=4)


def test_a_driver_asking_more_memory_than_a_node_gives_ray_is_refused_at_submit(tmp_path: Path) -> None:
    """--entrypoint-memory 1000G on nodes whose Ray memory is 90 GiB: refused before queueing (as
    --entrypoint-num-cpus 1e9 is), not FAILED 70 s later; what fits, or an unknown size, passes."""
    big = CLUSTER.model_copy(update={"memory_per_node": 90 * 2**30})
    spec = command_spec(["python", "x.py"], sets=["entrypoint_memory=1000G"])
    with pytest.raises(
        ConfigError, match=r"entrypoint_memory=1000.0 GiB but a node of .* gives Ray 90.0 GiB"
    ):
        resolve(spec, big, tmp_path, "command")
    fits = command_spec(["python", "x.py"], sets=["entrypoint_memory=8G"])
    assert resolve(fits, big, tmp_path, "command").entrypoint_memory == 8 * 2**30
    assert resolve(spec, CLUSTER, tmp_path, "command").entrypoint_memory == 1000 * 2**30  # (size unknown)


def test_a_plan_of_more_nodes_than_held_is_laid_out_on_the_nodes_an_elastic_cluster_grows_to(
    tmp_path: Path,
) -> None:
    """Issue 66: a GRPO plan's learners and engines are a demand the queue grows for. On a 1-node
    cluster of 4 GPUs that grows to 3 (`--max-nodes 3`), a plan of 4 learners and 4 engines with
    `needs.nodes: 2` is laid out on 2 nodes and waits for them; without max_nodes, or beyond it,
    it is refused at submit as before."""
    spec = command_spec(
        ["python", "grpo.py", "{plan.flags}"],
        sets=["plan.kind=grpo", "plan.learners=4", "plan.engines=4", "plan.tp=1", "needs.nodes=2"],
    )
    one = ClusterRecord(name="c", nodes_expected=1, gpus_per_node=4, cpus_per_node=72)
    with pytest.raises(ConfigError, match=r"needs.nodes=2 but cluster 'c' has 1 node"):
        resolve(spec, one, tmp_path, "command")
    elastic = one.model_copy(update={"max_nodes": 3})
    request = resolve(spec, elastic, tmp_path, "command")
    assert request.needs == {"nodes": 2}
    assert "--num_learners_per_node 2 2 --vllm_num_engines 4 " in (request.planned or ""), request.planned
    too_big = command_spec(["python", "grpo.py"], sets=["needs.nodes=4"])
    with pytest.raises(ConfigError, match=r"needs.nodes=4"):
        resolve(too_big, elastic, tmp_path, "command")


def test_a_grpo_plan_that_fits_only_a_grown_cluster_asks_for_its_nodes(tmp_path: Path) -> None:
    """Issue 66, item 4: without `needs`, the plan itself is the demand. 4 learners and 4 engines on
    a 4-GPU node that grows to 3: it asks for 2 nodes and is laid out on them; 2 and 2 fit the node
    it holds and ask for nothing (it takes the cluster as it is); 16 and 16 fit no cluster of 3 and
    are refused at submit; a cluster that never grows (local) asks for nothing."""

    def grpo(learners: int, engines: int) -> JobSpec:
        sets = ["plan.kind=grpo", f"plan.learners={learners}", f"plan.engines={engines}"]
        return command_spec(["python", "grpo.py", "{plan.flags}"], sets=sets)

    elastic = ClusterRecord(name="c", nodes_expected=1, gpus_per_node=4, cpus_per_node=72, max_nodes=3)
    request = resolve(grpo(4, 4), elastic, tmp_path, "command")
    assert request.needs == {"nodes": 2}
    assert "--num_learners_per_node 2 2 --vllm_num_engines 4 " in (request.planned or ""), request.planned
    assert resolve(grpo(2, 2), elastic, tmp_path, "command").needs == {}
    with pytest.raises(ConfigError, match=r"field 'plan'"):
        resolve(grpo(16, 16), elastic, tmp_path, "command")
    local = elastic.model_copy(update={"backend": "local"})
    with pytest.raises(ConfigError, match=r"field 'plan'"):
        resolve(grpo(4, 4), local, tmp_path, "command")
