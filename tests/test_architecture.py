"""The import contracts of `make lint` hold on this tree and fail on a copy that breaks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "bench", "demo", "producer", "worker", "dispatch", "db", "detq")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _copy_tree(dest: Path) -> Path:
    skip = shutil.ignore_patterns("assets", "__pycache__")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dest / package, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_tree_keeps_its_contracts(tmp_path: Path) -> None:
    done = _lint_imports(_copy_tree(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 2 kept, 0 broken." in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("producer/status.py", "import torch  # noqa: F401", "producer is not allowed to import torch"),
        ("producer/export.py", "import worker.batch  # noqa: F401", "producer.export -> worker.batch"),
        ("worker/batch.py", "import producer.status  # noqa: F401", "worker.batch -> producer.status"),
        ("db/models.py", "import producer.status  # noqa: F401", "db.models -> producer.status"),
        ("detq/settings.py", "import db.models  # noqa: F401", "detq.settings -> db.models"),
        ("demo/shapes.py", "import bench.photos  # noqa: F401", "demo.shapes -> bench.photos"),
        ("worker/batch.py", "import cli.main  # noqa: F401", "worker.batch -> cli.main"),
    ],
)
def test_a_forbidden_import_breaks_lint(tmp_path: Path, module: str, line: str, broken: str) -> None:
    # Given a copy of the tree where one module gains a forbidden import
    tree = _copy_tree(tmp_path)
    with (tree / module).open("a", encoding="utf-8") as handle:
        handle.write(f"\n{line}\n")
    # When import-linter checks it, Then it fails and names the offending import
    done = _lint_imports(tree)
    assert done.returncode == 1
    assert broken in done.stdout
