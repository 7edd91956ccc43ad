"""The package's imports run one way: main -> pipeline -> stages -> runner -> library
(export, the other command, sits beside main: runner and library only; the studies sit above
the pipeline: pipeline, stages, config_presets, runner and library; results, the finished
run, sits on the runner, whose builders make its policy; sweep on results).

Every `import` statement (module level or inside a function) of every module of grpo_jax is
read with `ast`; the test fails on any import cycle between modules and on any import
against the layering."""

from __future__ import annotations

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "grpo_jax")
LIBRARY = ("losses", "models", "sampling", "text", "tasks", "rewards", "rl", "sft", "evals",
           "parallel", "training", "checkpoint", "metrics", "trackers", "compilation",
           "host_memory")


def _modules() -> dict[str, str]:
    """module name -> file path, for every module of the package."""
    found = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                found[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return found


def _imports(path: str, module: str, known: set[str]) -> set[str]:
    """The grpo_jax modules `module` imports (a name imported from a package counts as
    that package's submodule when one exists, else as the package)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "grpo_jax")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "grpo_jax":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in known else source)
    return {m for m in out if m in known and m != module}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: _imports(p, m, known) for m, p in modules.items()}


def test_the_import_walker_sees_the_layers(graph):
    # A sanity check of the walker itself: known edges are found.
    assert "grpo_jax.stages" in graph["grpo_jax.pipeline"]
    assert "grpo_jax.runner.rl_loop" in graph["grpo_jax.stages.rl"] or \
        "grpo_jax.runner" in graph["grpo_jax.stages.rl"]
    assert "grpo_jax.losses" in graph["grpo_jax.rl.ppo"]
    assert len(graph) > 60


def test_no_import_cycle(graph):
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    return parts[1] if parts[1] in ("main", "api", "export", "pipeline", "stages", "runner",
                                    "studies", "config_presets", "results", "sweep", "serve",
                                    "config_reference") else "library"


def test_imports_run_one_way(graph):
    allowed = {  # layer -> layers it may import
        "main": {"pipeline", "runner", "library"},
        # the Python entry point (config -> run -> result): the command line without flags
        "api": {"pipeline", "config_presets", "results", "runner", "library"},
        # the studies (python -m grpo_jax.studies) sit above the pipeline: runs, their configs
        # (stage kinds' default sections) and finished runs' policies
        "studies": {"studies", "pipeline", "stages", "config_presets", "results", "sweep",
                    "runner", "library"},
        # a finished run: its files read with the library, its policy built by the runner
        "results": {"runner", "library"},
        # seeded sweeps: subprocess runs, read back as finished runs
        "sweep": {"results", "library"},
        # the shared config builders of configs/*.py: stage kinds' default sections
        "config_presets": {"stages", "library"},
        # the config reference page: the main job, the stage kinds' sections, their checks
        "config_reference": {"config_presets", "stages", "runner", "library"},
        "export": {"runner", "library"},
        # the policy as a server: a finished run's policy, prompted as the run prompts
        "serve": {"serve", "results", "runner", "library"},
        "pipeline": {"stages", "runner", "library"},
        "stages": {"stages", "runner", "library"},
        "runner": {"runner", "library"},
        "library": {"library"},
        "package": set(),
    }
    bad = [f"{m} ({_layer(m)}) imports {d} ({_layer(d)})" for m, deps in graph.items()
           for d in deps if d != "grpo_jax" and _layer(d) not in allowed[_layer(m)]]
    assert not bad, bad


def test_the_registry_imports_nothing_of_the_package_and_stages_only_the_registry_list(graph):
    assert graph["grpo_jax.runner.registry"] == set()
    # A stage module imports the runner and the library, never another stage module: the
    # one place that knows every kind is grpo_jax/stages/__init__.py.
    for module, deps in graph.items():
        if module.startswith("grpo_jax.stages."):
            assert not {d for d in deps if d.startswith("grpo_jax.stages")}, module


def test_library_has_no_run_or_config_objects():
    """rl/ and the other library packages take arrays and plain settings, not a Run."""
    offenders = []
    for module, path in _modules().items():
        if _layer(module) != "library":
            continue
        source = open(path, encoding="utf-8").read()
        for needle in ("run.config", "run.params", "import ml_collections", "from ml_collections",
                       "def default_section"):
            if needle in source:
                offenders.append(f"{module}: {needle}")
    assert not offenders, offenders


def _package(module: str) -> str:
    """The library package (or top-level module) a module belongs to: "models", "rl", ..."""
    return module.split(".")[1]


def test_library_packages_import_each_other_one_way(graph):
    """Between library packages the imports form no cycle either (a package imports another
    only where that one never imports it back, directly or not)."""
    edges: dict[str, set[str]] = {}
    for module, deps in graph.items():
        if _layer(module) != "library":
            continue
        for dep in deps:
            if dep != "grpo_jax" and _package(dep) != _package(module):
                edges.setdefault(_package(module), set()).add(_package(dep))

    def reaches(start, goal, seen=()):
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, (*seen, nxt)))
                   for nxt in edges.get(start, ()))

    both_ways = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if reaches(b, a))
    assert not both_ways, both_ways


@pytest.mark.parametrize("package,floor", [
    # Checkpoint readers (models.hf, text.hf) read JSON through grpo_jax.json_files, not
    # through the task data loader; rl's reward model encodes its rows with text.rows, not
    # through sft.
    ("models", "tasks"), ("text", "tasks"), ("rl", "sft"), ("sft", "rl"),
    ("json_files", "*"), ("storage", "*"),
])
def test_library_floors(graph, package, floor):
    found = sorted(f"{m} -> {d}" for m, deps in graph.items()
                   if m.startswith("grpo_jax.") and _package(m) == package
                   for d in deps if d != "grpo_jax" and _package(d) != package
                   and (floor == "*" or _package(d) == floor))
    assert not found, found


def test_the_run_builders_import_in_layer_order_without_lazy_imports(graph):
    """What a run is built from, by layer: run_directory -> prompts -> tokenizers ->
    model_init -> inputs; each imports only the layers above it, and every import at
    module level."""
    order = [f"grpo_jax.runner.{name}"
             for name in ("run_directory", "prompts", "tokenizers", "model_init", "inputs")]
    for index, module in enumerate(order):
        assert not graph[module] & set(order[index + 1:]), module
        tree = ast.parse(open(_modules()[module], encoding="utf-8").read())
        lazy = [f"{module}:{sub.lineno}" for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))]
        assert not lazy, lazy
