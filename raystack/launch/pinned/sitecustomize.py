"""Keeps a packed job's Ray tasks, actors and placement groups on the nodes the queue runner
gave it (RAYSTACK_PIN_NODES: their Ray node ids). Ray enforces nothing of the kind, and the job's
code (or its framework: open-instruct, verl, ...) does not know its nodes, so every process of
the job (the driver and every worker, through PYTHONPATH in the job's runtime_env) starts with
this file: when Ray's modules are imported, `.remote()` and `placement_group()` get a default
label selector `ray.io/node-id in (...)` (Ray 2.49+), unless the caller chose a placement
group, a node or a selector itself.

It is loaded as `sitecustomize` by the job's processes only; raystack never imports it.
"""

import os
import sys

_NODES = os.environ.get("RAYSTACK_PIN_NODES", "").strip()
_TARGETS = ("ray.actor", "ray.remote_function", "ray.util.placement_group")


def _selector():
    return {"ray.io/node-id": "in(" + os.environ.get("RAYSTACK_PIN_NODES", _NODES) + ")"}


def _pin(options):
    """Add the job's selector to a task's or actor's options where Ray allows it."""
    if options.get("label_selector") or options.get("placement_group") not in (None, "default"):
        return
    strategy = options.get("scheduling_strategy")
    if strategy is not None and strategy not in ("DEFAULT", "SPREAD"):
        return  # (a placement group or a node the caller chose: a selector beside it crashes Ray)
    try:
        import ray.util

        if ray.util.get_current_placement_group() is not None:
            return  # (inside a placement group: its bundles are pinned already)
    except Exception:
        return
    options["label_selector"] = _selector()


def _patch(name, module):
    if name in ("ray.actor", "ray.remote_function"):
        cls = module.ActorClass if name == "ray.actor" else module.RemoteFunction
        original = cls._remote

        def _remote(self, *positional, **options):
            _pin(options)
            return original(self, *positional, **options)

        cls._remote = _remote
    else:
        original_pg = module.placement_group

        def placement_group(bundles, *args, **kwargs):
            if kwargs.get("bundle_label_selector") is None and len(args) < 5:
                kwargs["bundle_label_selector"] = [_selector() for _ in bundles]
            return original_pg(bundles, *args, **kwargs)

        module.placement_group = placement_group


class _Finder:
    """Patches Ray's modules right after they are executed (nothing is imported early)."""

    def find_spec(self, name, path=None, target=None):
        if name not in _TARGETS:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _patch(name, module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _NODES:
    sys.meta_path.insert(0, _Finder())
