"""The package layout is the architecture: imports point down the layers, never in a circle, the
CLI speaks only to the Python API, no module grows past 500 lines and no function past 50
(those not there yet, listed below, may only shrink),
docs/concepts.md's table of folders lists the layers in this order, and every wait goes through
raystack/waiting.py (no other module sleeps with `time.sleep` or loops around a sleep).
`python tests/test_layout.py` prints the tree and the graph.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "raystack"
# Lower layers never import higher ones. A module may import its own layer's modules.
LAYERS = [
    ["errors", "waiting", "durations"],
    ["store"],
    ["adapters"],
    ["walltime"],  # how an allocation ends and the chain goes on: the head, workers and clients
    ["plan"],
    ["launch"],
    ["spec"],
    ["allocation"],
    ["client"],
    ["cli", "__init__", "__main__"],
]
MAX_LINES = 500
MAX_FUNCTION = 50  # lines; a CLI verb's typer signature (one option a line) is not counted, its body is
# Not there yet (docs/development.md, "What is not yet so"): each may shrink, none may grow, and
# nothing joins the list. The two modules are one class each (the public Cluster, the queue
# runner's pass); the functions are each one sequence that reads top to bottom.
LONGER_MODULES = {"raystack.client.cluster": 552, "raystack.allocation.runner.loop": 590}
LONGER_FUNCTIONS = {
    "raystack.adapters.slurm.script.render": 57,
    "raystack.allocation.head.program.run_head": 59,
    "raystack.allocation.runner.loop.submit": 60,
    "raystack.allocation.runner.loop.follow": 58,
    "raystack.allocation.runner.loop.ended": 60,
    "raystack.cli.clusters.status": 56,
    "raystack.client.cluster.wait_ready": 58,
    "raystack.client.cluster.down": 57,
    "raystack.plan.topology.place": 56,
    "raystack.spec.workdir.scan": 53,
}
# What the CLI may import: the Python API, and the pure layers it shows (specs, plans, errors).
CLI_MAY_USE = {"cli", "client", "spec", "plan", "errors", "__init__"}
README = PACKAGE.parent / "docs" / "concepts.md"  # (the table of folders)


def layer_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    for i, names in enumerate(LAYERS):
        if part in names:
            return i
    raise AssertionError(f"{module}: not in any layer of tests/test_layout.py; add its folder there")


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(path: Path) -> set[str]:
    """raystack modules imported by a file (at any depth: a function-level import counts too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("raystack")}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("raystack")
        ):
            out.add(str(node.module))
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = {t for t in imports(path) if t in mods and t != name}
        # `from raystack import __version__` reads the package's metadata, nothing above it
        edges[name] = {t for t in targets if t != "raystack"}
    return edges


def test_imports_point_down() -> None:
    upward = []
    for src, targets in graph().items():
        for dst in targets:
            if layer_of(dst) > layer_of(src):
                upward.append(f"{src} -> {dst}")
    assert upward == [], "imports pointing up the layers: " + ", ".join(upward)


def test_no_import_circles() -> None:
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join([*stack[stack.index(nxt) :], nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_modules_stay_small() -> None:
    big = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    over = {n: c for n, c in big.items() if c > LONGER_MODULES.get(n, MAX_LINES)}
    assert over == {}, f"modules over {MAX_LINES} lines (or over their listed size): {over}"


def function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines; a CLI verb (a typer command) from its body's first statement."""
    first = node.lineno
    if any("command" in ast.unparse(d) for d in node.decorator_list):
        body = node.body
        if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        first = body[0].lineno
    return (node.end_lineno or node.lineno) - first + 1


def test_functions_stay_short() -> None:
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines, key = function_lines(node), f"{name}.{node.name}"
                if lines > LONGER_FUNCTIONS.get(key, MAX_FUNCTION):
                    long.append(f"{key}: {lines} lines")
    assert long == [], f"functions over {MAX_FUNCTION} lines (or over their listed size): " + ", ".join(long)


def test_the_lists_of_what_is_longer_only_hold_what_still_is() -> None:
    """An entry of LONGER_* that got under the limit is taken off (so the list only shrinks)."""
    big = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    assert [n for n in LONGER_MODULES if big.get(n, 0) <= MAX_LINES] == []
    sizes = {
        f"{name}.{node.name}": function_lines(node)
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert [n for n in LONGER_FUNCTIONS if sizes.get(n, 0) <= MAX_FUNCTION] == []


PAUSES = {"sleep", "pause", "wait"}  # what a loop that polls calls between its looks


def _calls(nodes: list[ast.AST]) -> list[ast.Call]:
    """The calls in `nodes`, not inside a function, lambda or class defined there (a step
    function handed to waiting.until is not a loop of its own)."""
    found, todo = [], list(nodes)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.Call):
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def hand_written_waits(path: Path) -> list[str]:
    """`time.sleep` anywhere, and loops that call a sleep, a pause or a timed wait."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "sleep"
            and getattr(node.value, "id", "") == "time"
        ):
            out.append(f"{path.name}:{node.lineno} time.sleep")
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "time"
            and any(a.name == "sleep" for a in node.names)
        ):
            out.append(f"{path.name}:{node.lineno} from time import sleep")
        elif isinstance(node, ast.While | ast.For | ast.AsyncFor):
            parts = [*node.body, *node.orelse, *([node.test] if isinstance(node, ast.While) else [])]
            for call in _calls(parts):
                name = getattr(call.func, "attr", getattr(call.func, "id", ""))
                if name in PAUSES and (name != "wait" or call.args or call.keywords):
                    out.append(f"{path.name}:{node.lineno} a loop that calls {name}() (line {call.lineno})")
    return out


def test_every_wait_goes_through_waiting() -> None:
    """No polling loop outside waiting.py: each uses waiting.until / at_most / retry with a clock
    that tests can drive (issue 44)."""
    found = [
        w for name, path in modules().items() if name != "raystack.waiting" for w in hand_written_waits(path)
    ]
    assert found == [], "waits written by hand (use raystack.waiting): " + "; ".join(found)


def folder(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def imports_from(src: str, allowed: Callable[[str], bool]) -> list[str]:
    """Imports of folder `src`'s modules whose target folder is not `allowed`."""
    return [
        f"{a} -> {b}"
        for a, targets in graph().items()
        if folder(a) == src
        for b in targets
        if not allowed(folder(b))
    ]


def test_cli_speaks_only_to_the_python_api() -> None:
    outside = imports_from("cli", lambda f: f in CLI_MAY_USE)
    assert outside == [], "the CLI goes around raystack.client: " + ", ".join(outside)


def test_allocation_runs_on_the_nodes_only() -> None:
    """allocation/ is what runs inside the allocation: nothing of it imports the login side."""
    assert imports_from("allocation", lambda f: f not in ("client", "cli")) == []


def test_the_readme_lists_the_layers_in_order() -> None:
    """The README's table of folders, top to bottom, is LAYERS from the top down."""
    rows = [ln for ln in README.read_text().splitlines() if ln.startswith("| `raystack/")]
    folders = [row.split("`")[1].removeprefix("raystack/").rstrip("/").removesuffix(".py") for row in rows]
    listed = [layer_of(f"raystack.{f}") for f in folders if f != "profiles"]
    assert listed == sorted(listed, reverse=True), f"README lists the layers out of order: {folders}"
    assert len(set(listed)) == len(LAYERS)  # every layer


def main() -> None:
    edges = graph()
    for name, path in modules().items():
        lines = len(path.read_text().splitlines())
        targets = ", ".join(sorted(t.removeprefix("raystack.") for t in edges[name])) or "-"
        print(f"{path.relative_to(PACKAGE.parent)!s:40} {lines:5}  -> {targets}")


if __name__ == "__main__":
    sys.exit(main())


# Where a backend's own words may appear outside raystack/adapters/ (see docs/development.md, "A new
# scheduler"): the local backend's plan (this machine's GPUs and CPUs) and nothing else.
BACKEND_MODULES = {
    "raystack.adapters.slurm",
    "raystack.adapters.slurm.script",
    "raystack.adapters.slurm.options",
    "raystack.adapters.slurm.reasons",
    "raystack.adapters.local",
}
MAY_USE_BACKEND: dict[str, set[str]] = {}  # (none: every backend through adapters/allocator.py)
SCHEDULER_READS = re.compile(
    r"""(environ|env)(\.get\(|\[)["']SLURM_|\[["'](sbatch|squeue|scancel|scontrol|sinfo|sacct)["']"""
)


def test_backends_stay_in_their_adapter() -> None:
    """A new backend is the files docs/development.md lists: nothing outside the adapters imports
    a backend's module (but the local plan), reads SLURM's variables or runs its commands."""
    strays = []
    for name, path in modules().items():
        if name.startswith("raystack.adapters"):
            continue
        allowed = MAY_USE_BACKEND.get(name, set())
        strays += [f"{name} imports {t}" for t in imports(path) & BACKEND_MODULES if t not in allowed]
        text = path.read_text()
        strays += [f"{name}: {m.group(0)}" for m in SCHEDULER_READS.finditer(text)]
    assert strays == [], strays


# SLURM's words as names in code (identifiers, module names) outside raystack/adapters/: what is
# left of them, module by module (issue 66: a scheduler owns its words). The count may only fall:
# a module that gains one, or a new module with one, fails; lower a count when you remove some.
# Comments, docstrings and user-facing messages may name SLURM (they are not counted).
SLURM_WORDS = re.compile(r"slurm|sbatch|squeue|scancel|scontrol|sinfo|sacct|srun", re.IGNORECASE)
SLURM_WORDS_LEFT = {  # (user-facing names SLURM's users know, and the deprecated ones kept a release)
    "raystack.spec.profile": 1,  # extra_sbatch: the profile key users write
    "raystack.client.allocate": 1,  # the profile's extra_sbatch, read
    "raystack.client.status": 3,  # the deprecated slurm_* fields of status --json (one release)
    "raystack.errors": 3,  # the deprecated Slurm* aliases of the scheduler's errors (one release)
}


def slurm_names(path: Path) -> int:
    """SLURM's words among the names of a file's code (not its comments or strings)."""
    import io
    import tokenize

    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return sum(1 for t in tokens if t.type == tokenize.NAME and SLURM_WORDS.search(t.string))


def test_slurms_words_stay_in_its_adapter_and_only_fall_elsewhere() -> None:
    grown = {}
    for name, path in modules().items():
        if name.startswith("raystack.adapters"):
            continue
        found = slurm_names(path)
        if found > SLURM_WORDS_LEFT.get(name, 0):
            grown[name] = f"{found} (at most {SLURM_WORDS_LEFT.get(name, 0)})"
    assert grown == {}, f"SLURM's words in code outside raystack/adapters/: {grown}"
    assert slurm_names(PACKAGE / "adapters" / "slurm" / "__init__.py") > 0  # (the counter sees them)
