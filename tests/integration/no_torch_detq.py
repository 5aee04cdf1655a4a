"""Run the detq CLI with `import torch` forbidden: an attempt writes DETQ_TORCH_MARK's file and fails."""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

MARK_VARIABLE = "DETQ_TEST_TORCH_MARK"  # read by this test wrapper only, not by detq


class TorchBlocker(importlib.abc.MetaPathFinder):
    """Refuses torch and records who asked."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == "torch" or fullname.startswith("torch."):
            with open(os.environ[MARK_VARIABLE], "a") as mark:
                mark.write(f"{fullname}\n")
            raise ImportError(f"{fullname} is forbidden in this process")
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, TorchBlocker())
    from detq.cli.main import main

    sys.exit(main(sys.argv[1:]))
