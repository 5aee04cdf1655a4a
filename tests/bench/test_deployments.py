"""The bench's warm-up folder: links to the first photos, two batches for each pool process."""

from __future__ import annotations

import os
from pathlib import Path

from bench.deployments import warm_up_folder


def test_the_warm_up_folder_links_two_batches_a_process_of_the_first_photos(tmp_path: Path) -> None:
    photos_dir = tmp_path / "photos"
    photos_dir.mkdir()
    photos = []
    for i in range(40):
        photo = photos_dir / f"p{i:02d}.jpg"
        photo.write_bytes(bytes([i]))
        photos.append(photo)
    folder = warm_up_folder(photos, tmp_path / "photos-warm-up", processes=2, batch_size=8)
    linked = sorted(folder.iterdir())
    assert [p.name for p in linked] == [p.name for p in photos[:32]]
    assert all(os.path.samefile(link, photos_dir / link.name) for link in linked)
    # Asked again (one folder serves every runner of a workload), it is left as it is.
    assert sorted(warm_up_folder(photos, folder, processes=2, batch_size=8).iterdir()) == linked
