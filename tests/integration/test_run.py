"""`detq run`: one command on one machine, results in a folder; Ctrl-C stops cleanly and a rerun resumes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.photos import write_photo
from tests.conftest import service_missing
from tests.integration.faults import digests, save_slow_model, wait_until, write_images
from tests.integration.harness import DETQ, Deployment
from tests.support import save_torchvision_detector

pytestmark = pytest.mark.integration


def _done_lines(out: Path) -> list[dict[str, object]]:
    path = out / "detections.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _done_in_ledger(deployment: Deployment) -> int:
    jobs = deployment.run_json("jobs")
    return sum(int(job["done"]) for job in jobs)


def test_run_writes_results_and_resumes_after_ctrl_c(embedded: Deployment, tmp_path: Path) -> None:
    # Given a folder of 64 images and a model of about 0.25 s an image, in batches of 8
    embedded.model = save_slow_model(tmp_path / "slow.pt", 250)
    embedded.extra.update({"DETQ_BATCH_SIZE": "8", "DETQ_TORCH_THREADS": "1"})
    images = write_images(tmp_path / "in", 64)
    before = digests(images)
    out = tmp_path / "results"
    command = [*DETQ, "run", str(tmp_path / "in"), "--out", str(out), "--workers", "1", "--save-images"]
    # When `detq run` is interrupted with Ctrl-C part-way
    first = subprocess.Popen(
        command,
        env=embedded.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C reaches it as in a terminal, however the suite was started (a shell's background job
        # ignores SIGINT, and its children inherit that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_until(lambda: _done_in_ledger(embedded) >= 8, 180, "8 images done")
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    # Then it stopped cleanly, said how to resume, and wrote what was done so far
    assert first.returncode == 130, err
    assert "the same command resumes" in err
    partial = _done_lines(out)
    assert 8 <= sum(row["status"] == "done" for row in partial) < 64
    # When the same command runs again
    started = time.monotonic()
    second = subprocess.run(
        command + ["--json"], env=embedded.env(), capture_output=True, text=True, timeout=300
    )
    # Then it finished the rest without redoing anything, and the folder holds every image's result
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout.strip().splitlines()[-1])
    assert (summary["images"], summary["detections"], summary["annotated"]) == (64, 64, 64)
    rows = _done_lines(out)
    assert sorted(row["path"] for row in rows) == sorted(str(p) for p in images)
    assert all(row["status"] == "done" and row["attempts"] == 1 for row in rows)
    assert len(json.loads((out / "coco_results.json").read_text())) == 64
    page = (out / "report.html").read_text()  # the run's report, beside its results
    assert "<html" in page.lower() and "slow.pt" in page
    assert len(list((out / "images").glob("*.png"))) == 64  # each at its path, in its format
    assert digests(images) == before
    print(f"\nresumed run finished in {time.monotonic() - started:.1f} s")
    # When it runs once more, with every image done
    jobs_before = embedded.run_json("jobs", "--all")
    third = subprocess.run(command, env=embedded.env(), capture_output=True, text=True, timeout=300)
    # Then it says there is nothing new, stops the workers it started without waiting for them to load
    # the model (they had nothing to do), and writes the same results
    assert third.returncode == 0, third.stderr
    assert "nothing new to queue: 64 images found, none new or changed" in third.stderr
    assert "ready on" not in (out / "worker.log").read_text()
    assert sorted(row["path"] for row in _done_lines(out)) == sorted(str(p) for p in images)
    # And it leaves no empty job behind in the ledger
    assert embedded.run_json("jobs", "--all") == jobs_before


def test_run_over_names_it_must_refuse_ends_rejected_without_waiting_for_workers(
    embedded: Deployment, tmp_path: Path
) -> None:
    # Given a folder whose only image has a name that is not UTF-8 (refused at the scan, rejected at once)
    folder = tmp_path / "in"
    folder.mkdir()
    os.close(os.open(bytes(folder) + b"/caf\xe9.jpg", os.O_WRONLY | os.O_CREAT))
    out = tmp_path / "results"
    # When `detq run` goes over it
    done = subprocess.run(
        [*DETQ, "run", str(folder), "--out", str(out), "--workers", "1", "--json"],
        env=embedded.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    # Then it ends with exit 4 and the image's reason in the results, its workers never waited for
    assert done.returncode == 4, done.stderr
    (row,) = _done_lines(out)
    assert row["status"] == "rejected" and "not valid UTF-8" in str(row["reason"])
    assert "ready on" not in (out / "worker.log").read_text()


def test_a_changed_threshold_is_new_work_and_force_runs_it_again(
    embedded: Deployment, tmp_path: Path
) -> None:
    from demo.shapes import write_dataset

    # Given a folder of shapes (the bundled demo model scores them from about 0.05 to 0.99)
    write_dataset(tmp_path / "in", 12, seed=3)
    out = tmp_path / "results"

    def run(*flags: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
        done = subprocess.run(
            [*DETQ, "run", str(tmp_path / "in"), "--out", str(out), "--workers", "1", *flags],
            env=embedded.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return done, _done_lines(out)

    # When it runs at --conf 0.3, then at --conf 0.7
    _, loose = run("--conf", "0.3")
    second, strict = run("--conf", "0.7")
    # Then the second run is new work, not "nothing new", and its results are those of 0.7
    assert "nothing new" not in second.stderr
    loose_scores = [d["score"] for r in loose for d in r["detections"]]  # type: ignore[attr-defined]
    strict_scores = [d["score"] for r in strict for d in r["detections"]]  # type: ignore[attr-defined]
    assert min(loose_scores) >= 0.3 and min(strict_scores) >= 0.7
    assert sorted(s for s in loose_scores if s >= 0.7) == sorted(strict_scores)
    assert len(strict_scores) < len(loose_scores)
    # And 0.3 once more is nothing new, its results the first run's; --force runs every image again
    third, again = run("--conf", "0.3")
    assert "nothing new to queue: 12 images found" in third.stderr and "conf 0.3" in third.stderr
    assert again == loose
    # (--force run with every speed-up off: the same detections as the tuned first run)
    _, forced = run("--conf", "0.3", "--force", "--as-saved")
    assert {r["job_id"] for r in forced} != {r["job_id"] for r in loose}
    assert sorted(d["score"] for r in forced for d in r["detections"]) == sorted(loose_scores)  # type: ignore[attr-defined]
    assert "speed-ups=off (as saved)" in (out / "worker.log").read_text()
    # And the job says what it was run with
    status = embedded.run_json("status")
    assert status["settings"]["score_threshold"] == 0.3
    assert "settings: conf 0.3" in embedded.run("status").stdout


def test_reruns_over_hopeless_files_start_no_worker_for_them_and_keep_exit_code_4(
    embedded: Deployment, tmp_path: Path
) -> None:
    # Given a folder of two good images, a 0-byte file and a text file named .jpg
    folder = tmp_path / "in"
    write_images(folder, 2)
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "notes.jpg").write_text("not an image\n")
    out = tmp_path / "results"
    command = [*DETQ, "run", str(folder), "--out", str(out), "--workers", "1"]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, env=embedded.env(), capture_output=True, text=True, timeout=300)

    # When the folder is run, then run again twice
    first, second, third = run(), run(), run()
    # Then the first run rejects the two for their content and ends with exit 4
    assert first.returncode == 4, first.stderr
    rows = {Path(str(r["path"])).name: r for r in _done_lines(out)}
    assert {n: r["status"] for n, r in rows.items()} == {
        "img_0000.png": "done",
        "img_0001.png": "done",
        "empty.jpg": "rejected",
        "notes.jpg": "rejected",
    }
    assert "this run: 2 done, 0 failed, 2 rejected" in first.stderr
    # And each rerun has nothing to do, starts no worker's model for the hopeless files, and says what
    # the folder holds with the same exit code
    for again in (second, third):
        assert again.returncode == 4, again.stderr
        assert "nothing new to queue: 4 images found" in again.stderr
        assert "this run: no image to process" in again.stderr
        assert "the folder: 4 images: 2 done, 2 rejected; " in again.stderr
        assert (
            "1 x empty file (0 bytes)" in again.stderr and "1 x not a recognised image format" in again.stderr
        )
        assert "ready on" not in (out / "worker.log").read_text()


def test_a_strangers_first_hour_from_the_clones_parent_folder(embedded: Deployment, tmp_path: Path) -> None:
    # Given a working folder holding a clone's folder named detq/, and a worker.py and a db.py of one's own,
    # each of which breaks anything that imports it
    here = tmp_path / "work"
    (here / "detq").mkdir(parents=True)
    (here / "detq" / "README.md").write_text("a clone of detq\n")
    for name in ("worker.py", "db.py", "producer.py"):
        (here / name).write_text(f"raise ImportError('the user\\'s own {name} was imported')\n")
    # And their own scripted torchvision detector, its classes named as docs/models.md shows, and a folder
    # of photos of mixed sizes, one a folder down and two turned by EXIF
    classes = ["__background__", *(f"thing{i}" for i in range(1, 91))]
    model = save_torchvision_detector(
        here / "stranger.pt", "ssdlite", calibrated=True, meta={"format": "torchvision", "classes": classes}
    )
    sizes = [(1600, 1200), (640, 480), (480, 640), (1024, 768), (800, 600), (500, 333)]
    photos = [tmp_path / "photos" / ("trip/" if i % 3 == 0 else "") / f"IMG_{i:04d}.jpg" for i in range(7)]
    for i, photo in enumerate(photos):
        photo.parent.mkdir(parents=True, exist_ok=True)
        write_photo(photo, *sizes[i % len(sizes)], seed=i, orientation=6 if i % 4 == 1 else 1)
    out = tmp_path / "results"
    # When detq run (its installed command, as a user types it) runs from there
    detq = Path(sys.executable).parent / "detq"
    command = [str(detq), "run", str(tmp_path / "photos"), "--model", str(model), "--out", str(out)]
    started = time.monotonic()
    with subprocess.Popen(
        [*command, "--save-images", "--conf", "0.02", "--workers", "1"],
        env=embedded.env(),
        cwd=here,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stderr is not None
        first_line = process.stderr.readline()
        first_after = time.monotonic() - started
        said = first_line + process.stderr.read()
        code = process.wait(timeout=600)
    assert code == 0, said[-3000:] + (out / "worker.log").read_text()[-3000:]
    # Then it said what it was doing at once, and its workers imported detq's own packages
    assert first_line.startswith("starting 1 cpu worker processes here") and first_after < 10, first_after
    assert "workers ready in" in said and "job 1: 7 images queued (conf 0.02)" in said
    assert "the user's own" not in (out / "worker.log").read_text()
    # As root (as CI runs), the workers' warning that they read whatever root can is shown once
    as_root = "detq run: worker warning: running as root: this worker can read any file root can"
    assert (as_root in said) == (os.geteuid() == 0) and said.count(as_root) <= 1
    # And the folder holds every image's result: JSON lines, COCO files, annotated copies at full size, report
    assert sorted(row["path"] for row in _done_lines(out)) == sorted(str(p) for p in photos)
    assert all(row["status"] == "done" for row in _done_lines(out))
    assert json.loads((out / "coco_results.json").read_text())
    assert len(json.loads((out / "coco_dataset.json").read_text())["images"]) == 7
    copies = sorted(p.relative_to(out / "images") for p in (out / "images").rglob("*.jpg"))
    assert copies == sorted(p.relative_to(tmp_path / "photos") for p in photos)
    # And the report, opened in headless Chromium, shows the model's name, classes, settings and every image
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        service_missing("chromium", FileNotFoundError("chromium not on PATH (apt-get install chromium)"))
    shown = subprocess.run(
        [
            str(browser),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--dump-dom",
            (out / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    dom = shown.stdout
    assert f"stranger.pt ({model}; sha256" in dom and "classes: __background__, thing1, thing2" in dom
    assert "<td>settings</td><td>conf 0.02</td>" in dom
    rows = re.findall(r'<tr data-name="([^"]+)">', dom)
    assert sorted(rows) == sorted(str(p.relative_to(tmp_path / "photos")) for p in photos)
    assert "7 of 7 images match; page 1 of 1" in dom
    assert all(f'href="images/{row}"' in dom for row in rows)  # each linked to its annotated copy
    assert re.search(r"thing\d+ ×\d+ \(best 0\.\d\d\)", dom)  # classes by name in the list
    # When a glob of some of those photos runs (quoted: detq expands it), at the same settings
    again = subprocess.run(
        [str(detq), "run", f"{tmp_path}/photos/**/IMG_000[0-3].jpg", "--model", str(model), "--conf", "0.02"]
        + ["--out", str(tmp_path / "some"), "--workers", "1"],
        env=embedded.env(),
        cwd=here,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # Then nothing is new, and its results hold those files alone, as the first run found them
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing new to queue: 4 images found" in again.stderr
    some = {str(row["path"]): row for row in _done_lines(tmp_path / "some")}
    assert sorted(some) == sorted(str(p) for p in photos[:4])
    assert all(row == some[row["path"]] for row in _done_lines(out) if row["path"] in some)


def _ultralytics_checkpoint(work: Path) -> Path:
    """An Ultralytics .pt checkpoint, as `yolo train` leaves one (made in its own process, offline)."""
    code = (
        "import sys; from pathlib import Path; from bench.yolo_export import prepare_ultralytics; "
        "u = prepare_ultralytics(Path(sys.argv[1])); u.YOLO('yolov8n.yaml').save(sys.argv[1] + '/best.pt')"
    )
    work.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code, str(work)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return work / "best.pt"


def test_a_model_file_detq_cannot_run_is_named_in_one_line_before_anything_starts(
    embedded: Deployment, tmp_path: Path
) -> None:
    import torch
    import torchvision

    # Given the files people have: a state_dict, a whole pickled detector, an Ultralytics checkpoint
    detector = torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    torch.save(detector.state_dict(), tmp_path / "detector.pth")
    torch.save(detector, tmp_path / "detector_whole.pt")
    files = {
        "detector.pth": "is a state_dict (weights only, no architecture)",
        "detector_whole.pt": "is a whole module saved with torch.save (torchvision.models.detection.ssd.SSD",
        "best.pt": "is an Ultralytics checkpoint, not a model file detq runs",
    }
    _ultralytics_checkpoint(tmp_path)
    images = write_images(tmp_path / "in", 4)
    for name, says in files.items():
        # When detq run is given it
        started = time.monotonic()
        done = subprocess.run(
            [
                *DETQ,
                "run",
                str(tmp_path / "in"),
                "--model",
                str(tmp_path / name),
                "--out",
                str(tmp_path / "o"),
            ],
            env=embedded.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        took = time.monotonic() - started
        # Then it says in one line what the file is and the command that converts it, and starts nothing
        print(f"\n{name}: refused in {took:.1f} s: {done.stderr.strip()}")
        assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
        assert says in done.stderr and "Traceback" not in done.stderr
        assert ("yolo export model=best.pt format=torchscript" in done.stderr) == (name == "best.pt")
        assert not (tmp_path / "o" / "worker.log").exists()
    # And no job was made
    assert embedded.run_json("jobs", "--all") == []
    assert len(images) == 4


def test_timeout_bounds_the_whole_run_from_the_workers_start(embedded: Deployment, tmp_path: Path) -> None:
    # Given 64 images at about 0.25 s each (16 s of work for one process) and a run given 4 s in all,
    # the workers' start included
    embedded.model = save_slow_model(tmp_path / "slow.pt", 250)
    embedded.extra.update({"DETQ_BATCH_SIZE": "8", "DETQ_TORCH_THREADS": "1"})
    write_images(tmp_path / "in", 64)
    out = tmp_path / "results"
    started = time.monotonic()
    done = subprocess.run(
        [*DETQ, "run", str(tmp_path / "in"), "--out", str(out), "--workers", "1", "--timeout", "4"],
        env=embedded.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    took = time.monotonic() - started
    # Then it gave up with exit 5 and said so in one line, having written what was done, well before the
    # work could have finished (the workers stop warm: the batch in hand, 2 s, finishes)
    print(f"\n--timeout 4: ended after {took:.1f} s")
    assert done.returncode == 5, done.stderr
    assert "--timeout 4 s reached" in done.stderr and "Traceback" not in done.stderr
    assert took < 16
    assert (out / "detections.jsonl").exists()


def test_a_run_whose_workers_cannot_start_leaves_no_job_and_no_run_waits_on_another_pool(
    embedded: Deployment, tmp_path: Path
) -> None:
    images = write_images(tmp_path / "in", 6)
    out = tmp_path / "results"

    def run(*flags: str) -> subprocess.CompletedProcess[str]:
        command = [*DETQ, "run", str(tmp_path / "in"), "--out", str(out), "--workers", "1", *flags]
        return subprocess.run(command, env=embedded.env(), capture_output=True, text=True, timeout=300)

    # When a run asks for the GPU pool on a host without a GPU
    gpu = run("--pool", "gpu")
    # Then it fails saying why, and leaves no job behind for the next run to resume
    assert gpu.returncode != 0 and "Traceback" not in gpu.stderr
    assert "made by this run, was deleted: nothing of it had run" in gpu.stderr, gpu.stderr
    assert embedded.run_json("jobs", "--all") == []
    # Given a job an enqueue left for the GPU pool
    enqueued = subprocess.run(
        [*DETQ, "enqueue", str(tmp_path / "in"), "--pool", "gpu", "--json"],
        env=embedded.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    job_id = int(json.loads(enqueued.stdout.strip().splitlines()[-1])["job_id"])
    # When a plain run goes over the folder (its workers serve the CPU pool)
    started = time.monotonic()
    plain = run()
    # Then it does not wait on that job: it says so, and what to type
    print(f"\nplain run beside a GPU job ended in {time.monotonic() - started:.1f} s: {plain.stderr.strip()}")
    assert f"job {job_id}, left unfinished by an earlier run, is queued for the gpu pool" in plain.stderr
    assert f"detq cancel {job_id}" in plain.stderr
    assert (
        "nothing new to queue: 6 images found, none new or changed since this model's earlier runs"
        in (plain.stderr)
        and f"job {job_id} holds some, queued for the gpu pool)" in plain.stderr
    )
    # And once that job is cancelled, the next run runs its images here
    cancelled = subprocess.run(
        [*DETQ, "cancel", str(job_id)], env=embedded.env(), capture_output=True, text=True, timeout=120
    )
    assert cancelled.returncode == 0, cancelled.stderr
    again = run()
    assert again.returncode == 0, again.stderr
    assert sorted(row["path"] for row in _done_lines(out) if row["status"] == "done") == sorted(
        str(p) for p in images
    )
