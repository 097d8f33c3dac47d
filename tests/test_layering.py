"""The package's layering (import-linter contracts in pyproject.toml) and where collectives live."""

from __future__ import annotations

import ast
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


def test_import_linter_contracts_are_kept() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint_imports is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[test]'")
    done = subprocess.run([lint_imports], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def _distributed_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            if "convert" in path.parts and name.startswith(CHECKPOINT_FORMAT_MODULE):
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
