"""scripts/gpu_kit.py: which of detq's dependencies travel to a lent GPU machine as wheels."""

from __future__ import annotations

import importlib.metadata as metadata

from tests.support import load_script


def test_the_kit_carries_detqs_own_dependencies_at_their_installed_versions_and_not_torchs() -> None:
    kit = load_script("gpu_kit")
    # Given the dependencies of detq with its worker extra, as installed here, for the device's Python
    needed = kit.closure("detq", frozenset({"worker"}), "3.12.3")
    # Then they reach through the extra and down the tree (torch, Celery's own, SQLAlchemy's migrations)
    assert {"torch", "torchvision", "celery", "kombu", "billiard", "sqlalchemy", "alembic", "mako"} <= set(
        needed
    )
    # And what travels is the rest of them but detq itself, torch's stack and the image libraries
    wheels = kit.carried(needed)
    assert {
        "celery",
        "kombu",
        "billiard",
        "vine",
        "sqlalchemy",
        "alembic",
        "pydantic-core",
        "croniter",
    } <= set(wheels)
    assert not {"detq", "torch", "torchvision", "triton", "numpy", "pillow", "opencv-python-headless"} & set(
        wheels
    )
    assert not [name for name in wheels if name.startswith(("nvidia-", "cuda-"))]
    # At the versions the suite runs with
    assert all(metadata.version(name) == version for name, version in wheels.items())


def test_names_compare_as_pip_compares_them() -> None:
    kit = load_script("gpu_kit")
    assert kit.normalize("Typing_Extensions") == kit.normalize("typing.extensions") == "typing-extensions"
    assert kit.normalize("pydantic_core") == "pydantic-core"
