"""The package's layering, checked from its own imports (see CONTRIBUTING.md).

Layers, lowest first; a module imports only its own layer folder and the layers below it:

    model, files                the shared vocabulary; untrusted files read bounded, digests,
                                the user cache
    bash, checks                the launch reader; the finding checks
    releases                    verl's releases as data: the index, the choice, their files,
                                environments and line maps
    pipeline                    manifest, pins, read, compose, resolved, profile, compile, lower,
                                snapshot, audit session, audit report
    upstream, conformance,      everything that runs upstream code; ours against upstream's math;
    memory                      the memory forecast (only the front ends import it)
    plugin, cli                 the two front ends
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pytest_verl_compat"
TRAINER = ROOT / "reference_trainer"
LAYERS = {
    "model": 0,
    "files": 0,
    "bash": 1,
    "checks": 1,
    "releases": 2,
    "pipeline": 3,
    "memory": 4,
    "upstream": 4,
    "conformance": 4,
    "plugin": 5,
    "cli": 5,
}
# Layers that may import the memory forecast (besides itself); the tests do too.
MEMORY_USERS = {"cli", "plugin"}
MAX_LINES = 800


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(folder: Path) -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(folder.rglob("*.py"))}


def _imports(path: Path, *, runtime_only: bool) -> set[str]:
    """Project modules imported by ``path``; ``runtime_only`` leaves out TYPE_CHECKING blocks
    and function-level imports (those cannot form an import-time cycle)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if runtime_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
        if runtime_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            skipped.update(id(n) for n in ast.walk(node) if n is not node)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith(("pytest_verl_compat", "reference_trainer"))}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "pytest_verl_compat" else None


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The module an imported name belongs to (``a.b.func`` → ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def test_every_module_is_in_a_layer() -> None:
    strays = [m for m in _modules(PACKAGE) if m != "pytest_verl_compat" and _layer(m) not in LAYERS]
    assert not strays, f"modules outside the layer folders: {strays}"


def test_layers_import_only_downward() -> None:
    modules = _modules(PACKAGE)
    wrong = []
    for module, path in modules.items():
        own = _layer(module)
        for imported in _imports(path, runtime_only=False):
            target = _known(imported, modules)
            other = _layer(target) if target else None
            if own is None or other is None or other == own:
                continue
            if LAYERS[other] >= LAYERS[own]:
                wrong.append(f"{module} imports {target} ({own} may not import {other})")
    assert not wrong, "\n".join(wrong)


def test_only_the_front_ends_import_the_memory_forecast() -> None:
    modules = _modules(PACKAGE)
    wrong = [
        f"{module} imports {target}"
        for module, path in modules.items()
        for imported in _imports(path, runtime_only=False)
        if (target := _known(imported, modules)) is not None
        and _layer(target) == "memory"
        and _layer(module) not in MEMORY_USERS | {"memory"}
    ]
    assert not wrong, "\n".join(wrong)


def _dependencies(path: Path, module: str, modules: dict[str, Path]) -> set[str]:
    """The project modules whose code ``module`` uses, by every import it makes: at module
    level, inside functions and under ``TYPE_CHECKING`` alike. ``from pkg import sub`` uses the
    submodule ``pkg.sub``; ``from pkg import name`` uses ``pkg``'s own ``__init__``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import, from this module's package
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                named.add(full if full in modules else base)
        elif isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
    found = {_known(name, modules) for name in named}
    return {name for name in found if name is not None and name != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycles() -> None:
    """No circle of imports, between layers or among the modules of one package: each module can
    be read, changed and tested with only what it imports below it."""
    modules = {**_modules(PACKAGE), **_modules(TRAINER)}
    graph = {m: _dependencies(p, m, modules) for m, p in modules.items()}
    assert not _cycles(graph), f"import cycles: {_cycles(graph)}"


def test_the_cycle_check_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("def f():\n    from pkg import a\n")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
    )
    (package / "b.py").write_text("from pkg import NAME\n")
    modules = {"pkg": package / "__init__.py", "pkg.a": package / "a.py", "pkg.b": package / "b.py"}
    graph = {m: _dependencies(p, m, modules) for m, p in modules.items()}
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg"}}
    assert _cycles(graph) == [["pkg", "pkg.a", "pkg.b"]]


def test_private_names_stay_in_their_module() -> None:
    """A name starting with ``_`` is its module's own: no other module of the project imports it."""
    borrowed = []
    for module, path in {**_modules(PACKAGE), **_modules(TRAINER)}.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level or source.startswith(("pytest_verl_compat", "reference_trainer")):
                    borrowed += [
                        f"{module} imports {source}.{alias.name}"
                        for alias in node.names
                        if alias.name.startswith("_") and alias.name != "__version__"
                    ]
    assert not borrowed, "\n".join(borrowed)


@pytest.mark.parametrize("folder", [PACKAGE, TRAINER], ids=lambda p: p.name)
def test_no_module_is_too_big_to_read(folder: Path) -> None:
    big = {
        m: n
        for m, p in _modules(folder).items()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_reference_trainer_never_imports_the_plugin() -> None:
    offenders = {
        m: sorted(i for i in _imports(p, runtime_only=False) if i.startswith("pytest_verl_compat"))
        for m, p in _modules(TRAINER).items()
    }
    assert not {m: i for m, i in offenders.items() if i}


def test_importing_the_plugin_is_cheap() -> None:
    code = (
        "import json, sys; import pytest_verl_compat.plugin; "
        "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'hydra', 'omegaconf', "
        "'verl', 'syrupy', 'deepdiff', 'yaml', 'numpy') if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert json.loads(out.stdout) == [], f"the pytest11 entry imports {out.stdout.strip()}"


def test_the_upstream_version_is_data_not_code() -> None:
    """Every string literal (docstrings aside) in the package is free of the pinned version."""
    import yaml

    manifest = yaml.safe_load((ROOT / "corpus" / "manifest.yaml").read_text())
    version = manifest["upstream"]["version"]
    found = []
    for module, path in _modules(PACKAGE).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and version in node.value
                and id(node) not in docstrings
            ):
                found.append(f"{module}:{node.lineno}: {node.value[:60]!r}")
    assert not found, "\n".join(found)
