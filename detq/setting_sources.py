"""Where settings' values come from: DETQ_* environment variables, over an optional .env file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PREFIX = "DETQ_"
ENV_FILE = ".env"


def _prefixed(pairs: Mapping[str, str | None]) -> dict[str, str]:
    """DETQ_<NAME>=value pairs as field name -> value, names in any case; an empty value is no value."""
    return {
        name[len(PREFIX) :].lower(): value
        for name, value in pairs.items()
        if value and name.upper().startswith(PREFIX)
    }


def environment(env_file: str | Path | None = ENV_FILE) -> dict[str, str]:
    """The settings' values from the environment, over those of env_file where it exists."""
    found: dict[str, str] = {}
    if env_file is not None and Path(env_file).is_file():
        from dotenv import dotenv_values  # only where a .env file exists

        found.update(_prefixed(dotenv_values(env_file)))
    found.update(_prefixed(os.environ))
    return found
