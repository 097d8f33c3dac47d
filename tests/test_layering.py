"""The package's layering (import-linter contracts in pyproject.toml), no import circles, and where
collectives live."""

from __future__ import annotations

import ast
import graphlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "snapshotkit"

# torch.distributed modules that only define tensor types (DTensor, ShardedTensor): reading a
# tensor's placement is planning; talking to other ranks is not.
TENSOR_TYPE_MODULES = ("torch.distributed.tensor", "torch.distributed._shard")
# torch.distributed.checkpoint is a file format to snapshotkit.convert, which reads and writes it in
# one process (no_dist=True), never talking to other ranks.
CHECKPOINT_FORMAT_MODULE = "torch.distributed.checkpoint"
# DCP's stager builds its CPU copy of a state dict with these helpers (local copies, no collectives);
# snapshotkit/dcp.py's stager does the same.
STAGING_HELPERS_MODULE = "torch.distributed._state_dict_utils"


def test_import_linter_contracts_are_kept() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint_imports is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[test]'")
    done = subprocess.run([lint_imports], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, module: str, modules: set[str]) -> set[str]:
    """The package's modules ``module`` imports anywhere: at the top, inside functions (which hide a
    circle from import time, not from the design) and under ``TYPE_CHECKING``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]  # a name may be a submodule
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            # A package's __init__ importing its own modules is how it is built, not a circle.
            if name and name != module and not (path.name == "__init__.py" and name.startswith(module + ".")):
                found.add(name)
    return found


def test_no_import_circles() -> None:
    paths = {_module_of(path): path for path in PACKAGE.rglob("*.py")}
    graph = {module: _imported(path, module, set(paths)) for module, path in paths.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        circle = " -> ".join(exc.args[1])
        pytest.fail(f"import circle (counting imports in functions and under TYPE_CHECKING): {circle}")


def _uses_checkpoint_format(path: Path) -> bool:
    """convert/ reads and writes DCP's format; dcp.py and _dcp/ are DCP's storage layer (its
    interfaces, no collectives: DCP exchanges what they return)."""
    return "convert" in path.parts or "_dcp" in path.parts or path.name == "dcp.py"


def _distributed_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            if _uses_checkpoint_format(path) and name.startswith((CHECKPOINT_FORMAT_MODULE, STAGING_HELPERS_MODULE)):
                continue
            if name.startswith("torch.distributed") and not name.startswith(TENSOR_TYPE_MODULES):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    return found


def test_only_dist_talks_to_the_process_group() -> None:
    offenders = [
        line
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_dist.py" and "testing" not in path.parts
        for line in _distributed_imports(path)
    ]
    assert offenders == [], "collectives belong in snapshotkit/_dist.py:\n" + "\n".join(offenders)


def test_no_module_is_much_over_500_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 520
    }
    assert long == {}, f"split these modules (one concept per module): {long}"
