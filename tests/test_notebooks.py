"""The derivation notebooks: each one executes top to bottom, and none is committed with outputs.

A notebook's own `assert`s are the checks (identities of the derivation, computed with the
library's kernels), so executing it is the test. The kernel is this interpreter
(`sys.executable`), found through a kernelspec written into a temporary JUPYTER_PATH, so
neither a user-level kernelspec nor a read-only HOME can change what runs.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = {
    "policy_gradient_theorem.ipynb",
    "baselines.ipynb",
    "gae.ipynb",
    "trpo.ipynb",
    "ppo_clipping.ipynb",
    "grpo.ipynb",
    "r1_zero_miniature.ipynb",
}
# Per-cell ceiling against a hung kernel only; each notebook is sized to run in well under
# 90 s on two CPU cores (the slowest, r1_zero_miniature, about a minute).
CELL_TIMEOUT_S = 600


def _ids(path: pathlib.Path) -> str:
    return path.stem


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """Environment for a python3 kernel on this interpreter, with every writable dir in tmp."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (tests)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))  # searched before ~/.local
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "matplotlib"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # notebook 7's work directory lands here
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    # One host device in the kernels (conftest asks for 8 virtual ones for the sharding tests).
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if "xla_force_host_platform_device_count" not in f
    ]
    monkeypatch.setenv("XLA_FLAGS", " ".join(flags))
    # The package is importable from the checkout even without `pip install -e .`.
    pythonpath = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), pythonpath) if p))
    return tmp_path


def test_every_derivation_step_has_a_notebook():
    assert {p.name for p in NOTEBOOKS} == EXPECTED
    readme = (NOTEBOOK_DIR / "README.md").read_text(encoding="utf-8")
    for name in EXPECTED:
        assert name in readme, f"notebooks/README.md does not describe {name}"


def _setup_requirements() -> dict[str, set[str]]:
    """setup.py's install_requires and extras as {"install": {...}, extra: {...}}, each a
    set of distribution names (lower case, "-" for "_", no version)."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, "id", None) == "setup")
    keywords = {k.arg: ast.literal_eval(k.value) for k in call.keywords
                if k.arg in ("install_requires", "extras_require")}
    name = lambda req: re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower().replace("_", "-")
    out = {"install": {name(r) for r in keywords["install_requires"]}}
    out.update({extra: {name(r) for r in reqs}
                for extra, reqs in keywords["extras_require"].items()})
    return out


# Modules the notebooks import that come with a listed distribution rather than by its name.
_PROVIDED_BY = {"IPython": "ipykernel", "scipy": "jax", "grpo_jax": "grpo_jax"}


def test_what_the_notebooks_import_installs_with_the_dev_extra():
    """`pip install -e ".[dev]"` is enough to execute every notebook (this test's nbclient,
    nbformat, ipykernel, and what the cells import); the "notebooks" extra adds JupyterLab."""
    requirements = _setup_requirements()
    installed = requirements["install"] | requirements["dev"] | {"grpo-jax"}
    assert {"nbformat", "nbclient", "ipykernel"} <= requirements["dev"]
    assert {"nbformat", "nbclient", "ipykernel", "jupyterlab"} <= requirements["notebooks"]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            for node in ast.walk(ast.parse(cell.source)):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    modules = [node.module]
                else:
                    continue
                for module in (m.split(".")[0] for m in modules):
                    if module in sys.stdlib_module_names:
                        continue
                    dist = _PROVIDED_BY.get(module, module).lower().replace("_", "-")
                    assert dist in installed, f"{path.name} imports {module}, not in setup.py"


def test_readme_says_how_to_run_the_notebooks():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "pytest -n 0 tests/test_notebooks.py" in readme
    assert "jupyter execute notebooks/" in readme


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_committed_notebook_has_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: cell {index} has outputs"
            assert cell.execution_count is None, f"{path.name}: cell {index} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_uses_the_library_and_checks_itself(path):
    nb = nbformat.read(path, as_version=4)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "from grpo_jax" in source, f"{path.name} does not compute with grpo_jax"
    assert "assert" in source, f"{path.name} checks nothing"
    assert nb.cells[0].cell_type == "markdown" and "$" in prose, f"{path.name} has no equations"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_executes(path, kernel_env):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors
    # The executed copy is discarded; the committed file keeps no outputs.
    assert all(
        c.outputs == [] for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"
    )
