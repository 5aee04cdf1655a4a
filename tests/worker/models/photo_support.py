"""Photos unlike the load checks' probes, for tests that compare a rewritten model with the one saved."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from bench.photos import write_photo


def unprobed_photos(folder: Path) -> list[Image.Image]:
    """A 2 MP photo, a 1280x960 one, noise at 640x480 and a small one (200x150): sizes and content the
    probes of a rewrite at load (worker/models/ssd_postprocess.py, sampled_resize.py) do not have."""
    return [
        Image.open(write_photo(folder / "a.jpg", 1600, 1200, seed=3)).convert("RGB"),
        Image.open(write_photo(folder / "b.jpg", 1280, 960, seed=4)).convert("RGB"),
        *(
            Image.fromarray(np.random.default_rng(s).integers(0, 256, (h, w, 3), dtype=np.uint8))
            for s, (h, w) in enumerate([(480, 640), (150, 200)])
        ),
    ]
