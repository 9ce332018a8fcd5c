"""The boundaries of docs/architecture.md, held by reading every module's imports.

Each package of `lib/specrepro` may import only the project modules its row allows (every
import counts: top-level, inside functions, `from x import y`), and the embedded engine none
of the suite's data libraries, since the GPU machine that runs it lacks them. A crossing
fails with the module, the line and the rule it breaks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib"
PKG = LIB / "specrepro"

# Layers, by module path prefix (longest match wins), and the project modules each may
# import. `specrepro` alone (the package's __version__) is always allowed.
SHARED = ("specrepro.speculative", "specrepro.metrics", "specrepro.identity", "specrepro.data",
          "specrepro.provenance", "specrepro.findings", "specrepro.folder_names")
# What every analysis package may import outside analysis (its own layer rule adds the
# analysis packages below it; none may import `specrepro.analysis` itself, the face).
ANALYSIS_BASE = ("specrepro.params", "specrepro.store", "specrepro.published",
                 "specrepro.probes", *SHARED)
RULES: dict[str, tuple[str, ...]] = {
    # an engine, like vLLM: could be split out of the project
    "specrepro.embedded": ("specrepro.embedded", "specrepro.speculative", "specrepro.metrics",
                           "specrepro.data"),
    # reaches engines over HTTP (the embedded one as a process), never their internals
    "specrepro.harness": ("specrepro.harness", "specrepro.params", "specrepro.store",
                          "specrepro.workloads", "specrepro.grading", "specrepro.probes",
                          *SHARED),
    # reads results tables only: never an engine, never the harness. Its __init__ (the names
    # notebooks call) may import every analysis package; inside, the packages are layered
    # finding <- verdict <- figures <- step_cost <- render, an arrow only upwards:
    "specrepro.analysis": ("specrepro.analysis", "specrepro.params", "specrepro.store",
                           "specrepro.published", "specrepro.probes", *SHARED),
    # the data a finding reads: its study, stored cells and the tables drawn from them
    "specrepro.analysis.finding": (*ANALYSIS_BASE, "specrepro.analysis.finding"),
    # the verdict: claims, rules, gates, mechanisms, outcomes; judges what a finding reads
    "specrepro.analysis.verdict": (*ANALYSIS_BASE, "specrepro.analysis.finding",
                                   "specrepro.analysis.verdict"),
    # the figures: draw the finding, marked as the verdict found it
    "specrepro.analysis.figures": (*ANALYSIS_BASE, "specrepro.analysis.finding",
                                   "specrepro.analysis.verdict", "specrepro.analysis.figures"),
    # the step-cost model: reads the verdict's mechanism bounds and draws on figures.common
    "specrepro.analysis.step_cost": (*ANALYSIS_BASE, "specrepro.analysis.finding",
                                     "specrepro.analysis.verdict", "specrepro.analysis.figures",
                                     "specrepro.analysis.step_cost"),
    # the rendering (display, summary, index, notebook runner): may read every package
    "specrepro.analysis.render": (*ANALYSIS_BASE, "specrepro.analysis.finding",
                                  "specrepro.analysis.verdict", "specrepro.analysis.figures",
                                  "specrepro.analysis.step_cost", "specrepro.analysis.render"),
    # measuring above analysis: decides replay or run and calls the harness
    "specrepro.pipeline": ("specrepro.pipeline", "specrepro.harness", "specrepro.analysis",
                           "specrepro.params", "specrepro.store", "specrepro.probes", *SHARED),
    # a gate names a column of the results tables
    "specrepro.params": ("specrepro.params", "specrepro.store", *SHARED),
    # the results store (its public interface: specrepro/store/__init__.py)
    "specrepro.store": ("specrepro.store", *SHARED),
    "specrepro.store.schema": (),  # the tables' columns: polars types only
    "specrepro.store.sharing": (),  # locks and the manifest file: no table
    # what a readable table file is; a damaged one set aside (every reader goes through it)
    "specrepro.store.integrity": ("specrepro.store.schema", "specrepro.store.sharing"),
    # a probe's answers in a manifest: read by `specrepro probe` and by the report
    "specrepro.probes": ("specrepro.params", *SHARED),
    "specrepro.workloads": ("specrepro.workloads", *SHARED),
    "specrepro.grading": ("specrepro.grading",),
    "specrepro.published": ("specrepro.published",),
    "specrepro.speculative": (),
    "specrepro.identity": (),
    "specrepro.metrics": (),
    "specrepro.data": (),
    "specrepro.provenance": (),
    "specrepro.folder_names": (),  # the rule for a name that becomes a results folder
    "specrepro.findings": (),  # the registry of findings: ids, read by params and analysis
    # the command-line dispatcher imports each subcommand's module lazily
    "specrepro.cli": ("specrepro",),
    # Tooling: makes what the runtime reads (flag lists, the checkpoint, exported folders);
    # it may import the runtime, no runtime layer imports it (test below)
    "specrepro.tools": (),  # the package's __init__
    # reads the engines' wheels with `ast`: the standard library only
    "specrepro.tools.extract_engine_cli": ("specrepro.tools.extract_engine_cli",),
    # trains models/embedded with the engine's model and drafters, on the GPU image
    "specrepro.tools.training": ("specrepro.tools.training", "specrepro.embedded",
                                 "specrepro.data", "specrepro.metrics"),
    # writes the checkpoint in the folders vLLM and SGLang load, on the GPU image
    "specrepro.tools.export": ("specrepro.tools.export", "specrepro.embedded"),
}
TOOLING = "specrepro.tools"
# Libraries the embedded engine, and the tooling that trains and exports it, must never
# import (the H200 image that trains, exports and serves it has none of them).
GPU_IMAGE = ("specrepro.embedded", "specrepro.tools.training", "specrepro.tools.export")
EMBEDDED_FORBIDDEN = ("polars", "papermill", "datasets", "pydantic", "pandas", "nbconvert",
                      "seaborn", "matplotlib")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(LIB).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement of a file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base == "specrepro":  # `from specrepro import x`: x is a module (or __version__)
                out += [(node.lineno, f"specrepro.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, base))
    return out


def rule_for(module: str) -> tuple[str, tuple[str, ...]]:
    if module == "specrepro":  # the package's __init__: its version, nothing else
        return module, ()
    layer = max((k for k in RULES if module == k or module.startswith(k + ".")), key=len,
                default=None)
    if layer is None:
        raise AssertionError(f"{module}: no boundary rule covers it; add its layer to RULES "
                             "here and to docs/architecture.md")
    return layer, RULES[layer]


def within(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


def crossings(files: list[Path]) -> list[str]:
    bad = []
    for path in files:
        module = module_name(path)
        layer, allowed = rule_for(module)
        for line, name in imports(path):
            rel = path.relative_to(LIB.parent)
            if name.startswith("specrepro.") and name != "specrepro.__version__":
                if not within(name, allowed):
                    bad.append(f"{rel}:{line}: {module} imports {name}; the {layer} layer may "
                               f"import only {', '.join(allowed) or 'no project module'}")
            elif layer in GPU_IMAGE and name.split(".")[0] in EMBEDDED_FORBIDDEN:
                bad.append(f"{rel}:{line}: {module} imports {name}; the embedded engine and "
                           f"what trains and exports it must not import "
                           f"{', '.join(EMBEDDED_FORBIDDEN)}")
    return bad


def project_files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_every_module_keeps_its_layer_boundary():
    bad = crossings(project_files())
    assert not bad, "boundary crossed:\n" + "\n".join(bad)


@pytest.mark.parametrize("layer, body, words", [
    ("analysis", "from specrepro.harness.runner import run_study\n", "imports specrepro.harness.runner;"),
    ("analysis", "def f():\n    from specrepro.embedded import model\n", "imports specrepro.embedded;"),
    ("analysis", "from specrepro import pipeline\n", "imports specrepro.pipeline;"),
    # the analysis packages' layers: an arrow downwards, or to the face, is caught
    ("analysis/finding", "from specrepro.analysis.verdict.rules import Rule\n",
     "imports specrepro.analysis.verdict.rules;"),
    ("analysis/finding", "from specrepro.analysis import tables\n",
     "imports specrepro.analysis;"),
    ("analysis/verdict", "def f():\n    from specrepro.analysis.step_cost import suite\n",
     "imports specrepro.analysis.step_cost;"),
    ("analysis/verdict", "from specrepro.analysis.figures import marks\n",
     "imports specrepro.analysis.figures;"),
    ("analysis/figures", "from specrepro.analysis.step_cost.model import step\n",
     "imports specrepro.analysis.step_cost.model;"),
    ("analysis/figures", "from specrepro.analysis.render import show\n",
     "imports specrepro.analysis.render;"),
    ("analysis/step_cost", "from specrepro.analysis.render.summary import summary\n",
     "imports specrepro.analysis.render.summary;"),
    ("analysis/render", "from specrepro.harness import runner\n", "imports specrepro.harness;"),
    ("embedded", "import polars as pl\n", "must not import polars"),
    ("tools/training", "import polars as pl\n", "must not import polars"),
    ("tools/training", "from specrepro.store import ResultStore\n", "imports specrepro.store;"),
    ("embedded", "from specrepro.tools.training import cli\n", "imports specrepro.tools.training;"),
    ("tools/export", "import pandas\n", "imports pandas; the embedded engine and what"),
    ("embedded", "def f():\n    from specrepro.tools.export import drafters\n",
     "imports specrepro.tools.export;"),
    ("embedded", "from specrepro.harness import engines\n", "imports specrepro.harness;"),
    ("harness", "from specrepro.embedded.engine import LLMEngine\n", "imports specrepro.embedded.engine;"),
    ("params", "from specrepro import harness\n", "imports specrepro.harness;"),
    ("harness", "from specrepro.tools.extract_engine_cli import extract\n",
     "imports specrepro.tools.extract_engine_cli;"),
])
def test_a_crossing_is_caught_and_named(tmp_path, monkeypatch, layer, body, words):
    """The checker itself: a planted import in a layer's package fails with its file."""
    fake_lib = tmp_path / "lib"
    target = fake_lib / "specrepro" / layer / "planted.py"
    target.parent.mkdir(parents=True)
    target.write_text(body)
    monkeypatch.setattr(__import__(__name__), "LIB", fake_lib)
    bad = crossings([target])
    assert len(bad) == 1 and words in bad[0] and "planted.py" in bad[0], bad


def test_the_runtime_imports_no_tooling():
    """The arrow between runtime and tooling points one way: the tooling (specrepro.tools) may
    import the engine it trains and exports, no runtime module imports the tooling (the
    dispatcher `cli.py` names tooling modules as strings and imports them only when asked)."""
    bad = [f"{path.relative_to(LIB.parent)}:{line}: {module_name(path)} imports {name}"
           for path in project_files() if not within(module_name(path), (TOOLING,))
           for line, name in imports(path) if within(name, (TOOLING,))]
    assert not bad, "the runtime imports the tooling:\n" + "\n".join(bad)


def test_relative_imports_are_resolved(tmp_path, monkeypatch):
    fake_lib = tmp_path / "lib"
    target = fake_lib / "specrepro" / "analysis" / "planted.py"
    target.parent.mkdir(parents=True)
    target.write_text("from ..harness import runner\nfrom . import tables\n")
    monkeypatch.setattr(__import__(__name__), "LIB", fake_lib)
    assert [name for _, name in imports(target)] == ["specrepro.harness", "specrepro.analysis"]
