"""Wheels for a lent GPU machine: detq's dependencies that its image lacks, for its Python, in .whl/.

The device tool's machines have Python 3.12 with torch, torchvision, numpy, Pillow and OpenCV, and reach
no package index; Celery, SQLAlchemy, pydantic and the rest of detq's own dependencies travel as wheels
(at the versions installed here, which the suite ran with). Run here, then scripts/gpu_session.sh there:

    .venv/bin/python scripts/gpu_kit.py [--python-version 3.12.3] [--dest .whl]

The device tool carries the folder when a run names it (`carry: [".whl"]`); .gitignore keeps it out of
git. Exits 1 when pip cannot find a wheel, or when the wheels would not fit beside the working tree.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
# What the device image holds already and is too large to carry (the device tool's KINDS.md lists it):
# torch and the CUDA libraries it pulls in, and the image libraries the worker extra asks for.
PROVIDED = frozenset(
    {
        "torch",
        "torchvision",
        "triton",
        "numpy",
        "pillow",
        "opencv-python-headless",
        "sympy",
        "mpmath",
        "networkx",
        "filelock",
        "fsspec",
        "jinja2",
        "markupsafe",
        "setuptools",
    }
)
PROVIDED_PREFIXES = ("nvidia-", "cuda-")
# The device tool carries 64 MiB with the working tree (about 4 MiB): room kept for the rest.
MAX_WHEELS_BYTES = 56 * 2**20
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def normalize(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str, extras: frozenset[str], python_version: str) -> dict[str, str]:
    """Every distribution `root[extras]` needs on Linux x86-64 under that Python (major.minor.micro),
    with the version installed here: name -> version (a requirement not installed here raises
    PackageNotFoundError)."""
    environment = {
        "python_version": minor_version(python_version),
        "python_full_version": python_version,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    found: dict[str, str] = {}
    extras_seen: dict[str, frozenset[str]] = {}
    todo = [(root, extras)]
    while todo:
        name, wanted = todo.pop()
        dist = metadata.distribution(name)
        key = normalize(dist.metadata["Name"])
        if key in extras_seen and wanted <= extras_seen[key]:
            continue
        extras_seen[key] = extras_seen.get(key, frozenset()) | wanted
        found[key] = dist.version
        for text in dist.requires or []:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(
                marker.evaluate(environment | {"extra": extra}) for extra in {"", *extras_seen[key]}
            ):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return found


def minor_version(python_version: str) -> str:
    """3.12.3 -> 3.12."""
    return ".".join(python_version.split(".")[:2])


def carried(needed: dict[str, str], root: str = "detq") -> dict[str, str]:
    """What travels: the needed distributions but the project itself and what the image provides."""
    return {
        name: version
        for name, version in sorted(needed.items())
        if name != root and name not in PROVIDED and not name.startswith(PROVIDED_PREFIXES)
    }


def download(wheels: dict[str, str], python_version: str, dest: Path) -> None:
    """pip download of exactly these versions, binary wheels for that CPython on manylinux x86-64."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        + [
            "--python-version",
            minor_version(python_version),
            "--implementation",
            "cp",
            *platforms,
            "-d",
            str(dest),
        ]
        + [f"{name}=={version}" for name, version in wheels.items()],
        check=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python-version", default="3.12.3", help="the device's Python (KINDS.md)")
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl")
    args = parser.parse_args()
    wheels = carried(closure("detq", frozenset({"worker"}), args.python_version))
    args.dest.mkdir(parents=True, exist_ok=True)
    for stale in args.dest.glob("*.whl"):
        stale.unlink()  # one version of each: two would stop the install there
    try:
        download(wheels, args.python_version, args.dest)
    except subprocess.CalledProcessError:
        print("gpu_kit: pip found no wheel for one of them (above)", file=sys.stderr)
        return 1
    files = sorted(args.dest.glob("*.whl"))
    size = sum(f.stat().st_size for f in files)
    print(f"gpu_kit: {len(files)} wheels, {size / 2**20:.1f} MiB in {args.dest}")
    if size > MAX_WHEELS_BYTES:
        print(
            f"gpu_kit: over {MAX_WHEELS_BYTES // 2**20} MiB: the device tool would refuse them",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
