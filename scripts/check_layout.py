"""Layout rules `make lint` adds to ruff, mypy and import-linter: docstrings, real packages.

There is no line cap: one concept is one module however long it reads (shared/STYLE.md, cohesion over
size); a cap of 300 lines had split concepts across modules that must be read together (issue 42)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "detq", "db", "dispatch", "worker", "producer", "demo", "bench")
# Alembic revision files are data more than modules: their size follows the schema change.
EXEMPT_PARTS = ("migrations",)


def problems(root: Path = ROOT) -> list[str]:
    """Modules without a docstring, and folders of modules without __init__.py."""
    found: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if any(part in EXEMPT_PARTS for part in path.relative_to(root).parts):
                continue
            if not (path.parent / "__init__.py").is_file():
                # A namespace package imports, but import-linter cannot see inside it.
                found.append(f"{path.parent.relative_to(root)}: no __init__.py")
            text = path.read_text(encoding="utf-8")
            name = path.relative_to(root)
            if not ast.get_docstring(ast.parse(text)):
                found.append(f"{name}: no module docstring saying what it is for")
    return sorted(set(found))


def main() -> int:
    """Print each problem; exit 1 if there is any."""
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
