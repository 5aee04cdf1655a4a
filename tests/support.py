"""Test helpers: tiny models built in the tests, cuda-retagged archives, corrupt input folders."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

from PIL import Image

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """scripts/NAME.py imported as a module, as its tests call its functions (registered in sys.modules:
    the dataclasses of a module look it up there)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def save_fixed_box_model(
    path: Path,
    *,
    classes: tuple[str, ...] = ("background", "thing"),
    input_size: list[int] | None = None,
    score_threshold: float | None = None,
) -> Path:
    """A scripted torchvision-format model: one box at 25%..75% of each input, label 1, score 0.9."""
    import torch

    class FixedBox(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.corners = torch.nn.Parameter(torch.tensor([0.25, 0.25, 0.75, 0.75]), requires_grad=False)

        def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
            out: list[dict[str, torch.Tensor]] = []
            for img in images:
                h = float(img.shape[1])
                w = float(img.shape[2])
                size = torch.tensor([w, h, w, h], device=img.device, dtype=img.dtype)
                out.append(
                    {
                        "boxes": (self.corners.to(img.dtype) * size).unsqueeze(0),
                        "labels": torch.ones(1, dtype=torch.int64, device=img.device),
                        "scores": torch.full((1,), 0.9, device=img.device, dtype=img.dtype),
                    }
                )
            return out

    meta: dict[str, Any] = {"format": "torchvision", "classes": list(classes)}
    if input_size is not None:
        meta["input_size"] = input_size
    if score_threshold is not None:
        meta["score_threshold"] = score_threshold
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(FixedBox().eval())
        torch.jit.save(scripted, str(path), _extra_files={"detq.json": json.dumps(meta)})
    return path


def retag_archive_device(src: Path, dst: Path, device: str = "cuda:0") -> int:
    """Copy a TorchScript archive with every tensor storage tagged for `device`, as a GPU host saves it.

    torch.jit.save pickles each storage as a persistent id holding its location string ('cpu', 'cuda:0');
    that string is the only thing a GPU-saved archive differs in. Returns how many tags were rewritten.
    """
    old = b"X\x03\x00\x00\x00cpu"  # BINUNICODE 'cpu' (pickle protocol 2, memoised once per file)
    encoded = device.encode()
    new = b"X" + len(encoded).to_bytes(4, "little") + encoded
    rewritten = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(("/data.pkl", "/constants.pkl")):
                rewritten += data.count(old)
                data = data.replace(old, new)
            zout.writestr(info, data)
    return rewritten


def write_jpeg(path: Path, size: tuple[int, int], colour: tuple[int, int, int] = (90, 140, 200)) -> Path:
    """A plain JPEG of the given (width, height)."""
    Image.new("RGB", size, colour).save(path, "JPEG", quality=90)
    return path


def write_corrupt_folder(folder: Path, outside: Path) -> dict[str, str]:
    """Good and bad inputs side by side; returns file name -> expected terminal status."""
    folder.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    expected: dict[str, str] = {}
    for i, size in enumerate([(320, 240), (200, 300), (640, 360)]):
        write_jpeg(folder / f"good_{i}.jpg", size)
        expected[f"good_{i}.jpg"] = "done"
    # Content that is no image: rejected, as the file itself is (until it changes, no run tries it again)
    (folder / "empty.jpg").write_bytes(b"")
    expected["empty.jpg"] = "rejected"
    full = (folder / "good_0.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(full[: len(full) // 3])
    expected["truncated.jpg"] = "rejected"
    (folder / "notes.jpg").write_text("this is not an image\n")
    expected["notes.jpg"] = "rejected"
    secret = write_jpeg(outside / "secret.jpg", (100, 100))
    os.symlink(secret, folder / "escape.jpg")
    expected["escape.jpg"] = "rejected"
    return expected


YOLO_NAMES = {"0": "cat", "1": "dog"}


def save_scripted(module: Any, path: Path, extra: dict[str, str] | None = None) -> Path:
    """Script a module and save it with these extra files (its metadata), without torch's warnings."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(module), str(path), _extra_files=extra or {})
    return path


def _save_scripted_constant_output(path: Path, pred: Any, extra: dict[str, str]) -> Path:
    """A scripted model that takes [B, 3, H, W] and returns `pred` ([1, A, C]) repeated per image."""
    import torch

    class ConstantHead(torch.nn.Module):
        def __init__(self, value: torch.Tensor) -> None:
            super().__init__()
            self.register_buffer("pred", value)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.pred.expand(x.shape[0], -1, -1).clone()
            return out + x.mean() * 0

    return save_scripted(ConstantHead(pred).eval(), path, extra)


def ultralytics_config(imgsz: list[int], *, nms: bool = False) -> str:
    """config.txt as Ultralytics' TorchScript exporter writes it (names keys are strings after JSON)."""
    return json.dumps(
        {
            "description": "Ultralytics YOLO11n model",
            "author": "Ultralytics",
            "version": "8.3.0",
            "stride": 32,
            "task": "detect",
            "batch": 1,
            "imgsz": imgsz,
            "names": YOLO_NAMES,
            "args": {"batch": 1, "half": False, "nms": nms, "dynamic": False},
            "channels": 3,
        }
    )


def save_yolov8_like(path: Path) -> Path:
    """[1, 4 + 2, 3]: a dog at cx 320 cy 300 w 100 h 60 (0.9), a weaker duplicate (NMS), one below conf."""
    import torch

    pred = torch.tensor(
        [
            [320.0, 322.0, 100.0],  # cx
            [300.0, 302.0, 100.0],  # cy
            [100.0, 100.0, 50.0],  # w
            [60.0, 60.0, 50.0],  # h
            [0.1, 0.05, 0.2],  # cat
            [0.9, 0.6, 0.1],  # dog
        ]
    ).unsqueeze(0)
    return _save_scripted_constant_output(path, pred, {"config.txt": ultralytics_config([640, 640])})


def save_yolov5_like(path: Path) -> Path:
    """[1, 2, 5 + 2]: a dog scored obj 0.9 x cls 0.8 = 0.72, and a row under the objectness threshold."""
    import torch

    pred = torch.tensor(
        [[320.0, 300.0, 100.0, 60.0, 0.9, 0.2, 0.8], [100.0, 100.0, 20.0, 20.0, 0.1, 0.9, 0.9]]
    ).unsqueeze(0)
    config = json.dumps({"shape": [1, 3, 640, 640], "stride": 32, "names": ["cat", "dog"]})
    return _save_scripted_constant_output(path, pred, {"config.txt": config})


def save_final_boxes(path: Path) -> Path:
    """[1, 4, 6] final boxes in 640x640 input pixels: one cat at 270,270-370,330 (0.88), padded rows of 0."""
    import torch

    pred = torch.zeros(1, 4, 6)
    pred[0, 0] = torch.tensor([270.0, 270.0, 370.0, 330.0, 0.88, 0.0])
    meta = {"format": "boxes", "classes": ["cat", "dog"], "input_size": [640, 640]}
    return _save_scripted_constant_output(path, pred, {"detq.json": json.dumps(meta)})


def save_exported_boxes(path: Path) -> Path:
    """A torch.export program (.pt2), batch 1, 64x64 stretched input, one dog at 16,16-48,32 (0.77)."""
    import torch

    class Boxes(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(x.shape[0], 2, 6, device=x.device)
            out[:, 0, :4] = torch.tensor([16.0, 16.0, 48.0, 32.0], device=x.device)
            out[:, 0, 4] = 0.77
            out[:, 0, 5] = 1.0
            return out + x.mean() * 0

    meta = {"format": "boxes", "classes": ["cat", "dog"], "input_size": [64, 64], "letterbox": False}
    program = torch.export.export(Boxes(), (torch.zeros(1, 3, 64, 64),))
    torch.export.save(program, str(path), extra_files={"detq.json": json.dumps(meta)})
    return path


def save_exported_conv_yolo(path: Path) -> Path:
    """A torch.export program of a small convolutional net with YOLOv8's raw output ([B, 4 + 2, 100] at
    320x320, a dynamic batch): random weights whose boxes and scores follow the image's content."""
    import torch

    class ConvYolo(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.features = torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 3, stride=4, padding=1),
                torch.nn.ReLU(),
                torch.nn.Conv2d(8, 16, 3, stride=4, padding=1),
                torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(10),
                torch.nn.Conv2d(16, 6, 1),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raw = self.features(x).flatten(2)  # [B, 6, 100]
            grid = torch.arange(100, device=x.device, dtype=x.dtype)
            cx = (grid % 10 + 0.5) * 32 + torch.tanh(raw[:, 0]) * 16
            cy = (grid // 10 + 0.5) * 32 + torch.tanh(raw[:, 1]) * 16
            size = 24 + 40 * torch.sigmoid(raw[:, 2:4])
            scores = torch.sigmoid(raw[:, 4:6] * 4)
            return torch.cat([cx[:, None], cy[:, None], size, scores], dim=1)

    meta = {"format": "yolov8", "classes": ["cat", "dog"], "input_size": [320, 320]}
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(
        ConvYolo().eval(), (torch.zeros(2, 3, 320, 320),), dynamic_shapes={"x": {0: batch}}
    )
    torch.export.save(program, str(path), extra_files={"detq.json": json.dumps(meta)})
    return path


def save_traced_with_baked_device(path: Path, device: str = "cuda:0") -> Path:
    """A traced final-boxes model whose graph carries torch.device(<device>) as a constant.

    Tracing `torch.arange(n, device=x.device)` on a GPU records cuda:0; here we trace on the CPU and
    rewrite the archive's code the same way."""
    import torch

    class Traced(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n = x.shape[0]
            rows = torch.arange(2, device=x.device).float()
            out = torch.zeros(n, 2, 6, device=x.device)
            out[:, :, 0] = 10.0 + rows
            out[:, :, 1] = 10.0
            out[:, :, 2] = 30.0
            out[:, :, 3] = 30.0
            out[:, :, 4] = 0.8 - rows * 0.5
            return out + x.mean() * 0

    meta = {"format": "boxes", "classes": ["thing"], "input_size": [64, 64], "letterbox": False}
    plain = path.with_suffix(".cpu.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(Traced(), torch.zeros(1, 3, 64, 64))
        torch.jit.save(traced, str(plain), _extra_files={"detq.json": json.dumps(meta)})
    target = f'torch.device("{device}")'.encode()
    with zipfile.ZipFile(plain) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if info.filename.endswith(".debug_pkl"):  # source ranges of the original text; optional
                continue
            data = zin.read(info)
            if "/code/" in info.filename and info.filename.endswith(".py"):
                data = data.replace(b'torch.device("cpu")', target)
            zout.writestr(info, data)
    plain.unlink()
    return path


def save_torchvision_detector(
    path: Path, name: str, calibrated: bool = False, meta: dict[str, Any] | None = None
) -> Path:
    """A scripted torchvision detector built with weights=None (no download), saved as on this host.

    As built, SSDlite's activations fade through its layers (features of 1e-18 and less), so every anchor
    scores 1/91 in every class and its detections are its sorts' tie-breaks. calibrated: its BatchNorm
    statistics taken from seeded noise images first, so its scores differ as a trained model's do.
    retinanet, fcos and fasterrcnn_r18: the families whose transform keeps the aspect ratio and pads a
    batch to its largest image, on a ResNet-18 FPN at min_size 320 (quick on a CPU), their score
    thresholds lowered below the scores of untrained heads so that each image has its 100-300 boxes. meta:
    stored as the file's detq.json, as docs/models.md shows (classes, format...)."""
    import torch
    from torchvision.models import detection

    builders = {
        "ssdlite": detection.ssdlite320_mobilenet_v3_large,
        "fasterrcnn": detection.fasterrcnn_mobilenet_v3_large_320_fpn,
        "retinanet": _retinanet,
        "fcos": _fcos,
        "fasterrcnn_r18": _fasterrcnn_r18,
        "ssd": detection.ssd300_vgg16,
    }
    torch.manual_seed(0)
    model = builders[name](weights=None, weights_backbone=None).eval()
    if calibrated:
        _calibrate_batch_norm(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        extra = {"detq.json": json.dumps(meta)} if meta is not None else {}
        torch.jit.save(torch.jit.script(model), str(path), _extra_files=extra)
    return path


def _resnet18_fpn(p6p7: bool) -> Any:
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7

    if not p6p7:
        return resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5)
    return resnet_fpn_backbone(
        backbone_name="resnet18",
        weights=None,
        trainable_layers=5,
        returned_layers=[2, 3, 4],
        extra_blocks=LastLevelP6P7(256, 256),
    )


def _retinanet(**_: Any) -> Any:
    from torchvision.models.detection import RetinaNet

    return RetinaNet(_resnet18_fpn(True), num_classes=91, min_size=320, max_size=640, score_thresh=0.005)


def _fcos(**_: Any) -> Any:
    from torchvision.models.detection import FCOS

    return FCOS(_resnet18_fpn(True), num_classes=91, min_size=320, max_size=640, score_thresh=0.02)


def _fasterrcnn_r18(**_: Any) -> Any:
    from torchvision.models.detection import FasterRCNN

    return FasterRCNN(
        _resnet18_fpn(False),
        num_classes=91,
        min_size=320,
        max_size=640,
        box_score_thresh=0.005,
        rpn_pre_nms_top_n_test=300,
        rpn_post_nms_top_n_test=300,
    )


def _calibrate_batch_norm(model: Any) -> None:
    """Set every BatchNorm's running statistics to those of the model's inputs on eight noise images."""
    import torch

    layers = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None  # a plain average over the forward
        layer.train()
    generator = torch.Generator().manual_seed(0)
    images = [torch.rand(3, 320, 320, generator=generator) for _ in range(8)]
    with torch.no_grad():
        batch, _ = model.transform(images)
        model.backbone(batch.tensors)
    model.eval()


def write_png(path: Path, size: tuple[int, int]) -> Path:
    """A noisy PNG of (width, height): no JPEG draft, so decoded pixels are the original pixels."""
    Image.effect_noise(size, 30).convert("RGB").save(path)
    return path


def letterbox_expectation(
    box: tuple[float, float, float, float], size: tuple[int, int], dst: tuple[int, int] = (640, 640)
) -> list[float]:
    """Hand-computed Ultralytics letterbox inverse of a box in dst (w, h) input pixels to a (w, h) image."""
    (w0, h0), (dw, dh) = size, dst
    r = min(dh / h0, dw / w0)
    new_w, new_h = round(w0 * r), round(h0 * r)
    left, top = round((dw - new_w) / 2 - 0.1), round((dh - new_h) / 2 - 0.1)
    x1, y1, x2, y2 = box
    out = [
        (x1 - left) * w0 / new_w,
        (y1 - top) * h0 / new_h,
        (x2 - left) * w0 / new_w,
        (y2 - top) * h0 / new_h,
    ]
    return [
        min(max(out[0], 0), w0),
        min(max(out[1], 0), h0),
        min(max(out[2], 0), w0),
        min(max(out[3], 0), h0),
    ]


class CountsForwards:
    """Stands in for a loaded model's module: notes how many images each forward took, then runs it."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.sizes: list[int] = []

    def __call__(self, images: list[Any]) -> Any:
        self.sizes.append(len(images))
        return self.module(images)
