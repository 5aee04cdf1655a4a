"""Train detq's bundled demo detector (CenterNet-style, shapes) on the CPU and save it as TorchScript.

    .venv/bin/python scripts/train_demo_model.py            # defaults: seed 7, 1000 steps (~10 min, 2 cores)
    .venv/bin/python scripts/train_demo_model.py --steps 200 --out /tmp/quick.pt
    .venv/bin/python scripts/train_demo_model.py --rescript worker/assets/demo_detector.pt  # no training

The saved module follows the model contract the worker relies on: forward(List[Tensor CHW float RGB in
[0, 1], any size]) -> List[Dict["boxes" float32 [N, 4] x1 y1 x2 y2 in that input's pixels, "labels" int64
[N], "scores" float32 [N]]], sorted by descending score; resizing and normalisation happen inside.
Training data is drawn on the fly from demo.shapes.render_scene and the learning-rate schedule
depends on the step count only, so a run that finishes its --steps is deterministic for a seed and thread
count. --minutes is a safety cap: reaching it stops training early (not fully annealed) and says so.

The saved code calls its resizing operators directly rather than F.interpolate: TorchScript saves the body
of every function a module calls, and F.interpolate's names every mode of the torch that saved it (torch
2.14's, a lanczos operator older releases lack), so a file saved with a new torch would not load on an
older one. --rescript FILE saves a file's weights and metadata again with this code, without training.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from demo.scoring import PredictedBox, mean_average_precision, precision_recall  # noqa: E402
from demo.shapes import CLASSES, GroundTruthBox, random_image_size, render_scene  # noqa: E402

INPUT_SIZE = 256  # internal resolution (square; inputs are stretched to it)
STRIDE = 4  # output stride of the heatmap / regression maps
OUTPUT_SIZE = INPUT_SIZE // STRIDE
RENDER_MAX_SIDE = 640  # training scenes larger than this are rendered scaled down
DEFAULT_OUT = REPO / "worker" / "assets" / "demo_detector.pt"
PIXEL_MEAN = 0.45
PIXEL_STD = 0.25


# --------------------------------------------------------------------------------------------- model


def conv_bn_relu(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
    )


class ShapesNet(nn.Module):
    """Tiny FPN-like encoder-decoder: strides 2..32 down, top-down back to stride 4, heatmap + box heads."""

    def __init__(
        self,
        num_classes: int,
        channels: tuple[int, ...] = (16, 24, 48, 96, 128),
        width: int = 48,
        head_width: int = 32,
    ):
        super().__init__()
        c = channels
        self.stem = conv_bn_relu(3, c[0], 2)
        self.down4 = nn.Sequential(conv_bn_relu(c[0], c[1], 2), conv_bn_relu(c[1], c[1]))
        self.down8 = nn.Sequential(conv_bn_relu(c[1], c[2], 2), conv_bn_relu(c[2], c[2]))
        self.down16 = nn.Sequential(conv_bn_relu(c[2], c[3], 2), conv_bn_relu(c[3], c[3]))
        self.down32 = nn.Sequential(conv_bn_relu(c[3], c[4], 2), conv_bn_relu(c[4], c[4]))
        self.lat32 = nn.Conv2d(c[4], width, 1)
        self.lat16 = nn.Conv2d(c[3], width, 1)
        self.lat8 = nn.Conv2d(c[2], width, 1)
        self.lat4 = nn.Conv2d(c[1], width, 1)
        self.merge16 = conv_bn_relu(width, width)
        self.merge8 = conv_bn_relu(width, width)
        self.merge4 = conv_bn_relu(width, head_width)
        self.heat_head = nn.Sequential(
            conv_bn_relu(head_width, head_width), nn.Conv2d(head_width, num_classes, 1)
        )
        # Regression: log(w / STRIDE), log(h / STRIDE), centre offset x, y within the output cell.
        self.box_head = nn.Sequential(conv_bn_relu(head_width, head_width), nn.Conv2d(head_width, 4, 1))
        heat_out = self.heat_head[-1]
        assert isinstance(heat_out, nn.Conv2d) and heat_out.bias is not None
        nn.init.constant_(heat_out.bias, -2.19)  # prior 0.1, as in CenterNet

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = self.stem(x)
        c4 = self.down4(x)
        c8 = self.down8(c4)
        c16 = self.down16(c8)
        c32 = self.down32(c16)
        p = self.lat32(c32)
        p = self.merge16(upsample_nearest(p, list(c16.shape[-2:])) + self.lat16(c16))
        p = self.merge8(upsample_nearest(p, list(c8.shape[-2:])) + self.lat8(c8))
        p = self.merge4(upsample_nearest(p, list(c4.shape[-2:])) + self.lat4(c4))
        return self.heat_head(p), self.box_head(p)


def upsample_nearest(x: Tensor, size: list[int]) -> Tensor:
    """F.interpolate(x, size=size, mode="nearest"), as the one operator it runs (see the docstring)."""
    return torch.ops.aten.upsample_nearest2d(x, size, None, None)


def resize_antialiased(x: Tensor, size: list[int]) -> Tensor:
    """F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True), as the one
    operator it runs (see the docstring)."""
    return torch.ops.aten._upsample_bilinear2d_aa(x, size, False, None, None)


def preprocess(image: Tensor, size: int) -> Tensor:
    """CHW float [0, 1] of any size -> 1x3xSxS float32, stretched with antialiased bilinear resizing."""
    x = image.unsqueeze(0).to(torch.float32)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    elif x.shape[1] > 3:
        x = x[:, :3]
    if x.shape[-2] != size or x.shape[-1] != size:
        x = resize_antialiased(x, [size, size])
    return x


class DemoDetector(nn.Module):
    """The shipped module: list of images in, list of {boxes, labels, scores} out (see module docstring)."""

    def __init__(self, net: ShapesNet, top_k: int = 50, score_floor: float = 0.05):
        super().__init__()
        self.net = net
        self.input_size = INPUT_SIZE
        self.top_k = top_k
        self.score_floor = score_floor
        self.pixel_mean = PIXEL_MEAN
        self.pixel_std = PIXEL_STD

    def forward(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        results: list[dict[str, Tensor]] = []
        if len(images) == 0:
            return results
        batch = torch.cat([preprocess(image, self.input_size) for image in images], dim=0)
        batch = (batch - self.pixel_mean) / self.pixel_std
        heat_logits, box = self.net(batch)
        heat = torch.sigmoid(heat_logits)
        # Keep only the best class per cell, then 3x3 max-pool peaks.
        best = heat.max(dim=1, keepdim=True)[0]
        heat = heat * (heat >= best).to(heat.dtype)
        peaks = F.max_pool2d(heat, kernel_size=3, stride=1, padding=1)
        heat = heat * (heat >= peaks).to(heat.dtype)
        n, c, h, w = heat.shape
        k = min(self.top_k, c * h * w)
        scores, index = heat.reshape(n, c * h * w).topk(k, dim=1)
        labels = torch.div(index, h * w, rounding_mode="floor")
        cell = index - labels * (h * w)
        ys = torch.div(cell, w, rounding_mode="floor")
        xs = cell - ys * w
        reg = box.reshape(n, 4, h * w).gather(2, cell.unsqueeze(1).expand(n, 4, k))
        stride_x = float(self.input_size) / float(w)
        stride_y = float(self.input_size) / float(h)
        box_w = torch.exp(reg[:, 0].clamp(max=8.0)) * stride_x
        box_h = torch.exp(reg[:, 1].clamp(max=8.0)) * stride_y
        cx = (xs.to(heat.dtype) + reg[:, 2]) * stride_x
        cy = (ys.to(heat.dtype) + reg[:, 3]) * stride_y
        for i, image in enumerate(images):
            scale_x = float(image.shape[-1]) / float(self.input_size)
            scale_y = float(image.shape[-2]) / float(self.input_size)
            keep = scores[i] >= self.score_floor
            x1 = ((cx[i] - box_w[i] / 2.0) * scale_x).clamp(0.0, float(image.shape[-1]))
            y1 = ((cy[i] - box_h[i] / 2.0) * scale_y).clamp(0.0, float(image.shape[-2]))
            x2 = ((cx[i] + box_w[i] / 2.0) * scale_x).clamp(0.0, float(image.shape[-1]))
            y2 = ((cy[i] + box_h[i] / 2.0) * scale_y).clamp(0.0, float(image.shape[-2]))
            boxes = torch.stack([x1, y1, x2, y2], dim=1)[keep]
            results.append(
                {
                    "boxes": boxes.to(torch.float32),
                    "labels": labels[i][keep].to(torch.int64),
                    "scores": scores[i][keep].to(torch.float32),
                }
            )
        return results


def fuse_conv_bn(module: nn.Module) -> None:
    """Fold every eval-mode Conv2d+BatchNorm2d pair inside Sequentials into the conv (in place)."""
    for child in module.children():
        if isinstance(child, nn.Sequential):
            for i in range(len(child) - 1):
                conv, bn = child[i], child[i + 1]
                if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                    child[i] = torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn)
                    child[i + 1] = nn.Identity()
        fuse_conv_bn(child)


# ---------------------------------------------------------------------------------------------- data


def image_to_tensor(image: object) -> Tensor:
    array = np.asarray(image, dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).to(torch.float32) / 255.0


def make_targets(boxes: list[GroundTruthBox], width: int, height: int) -> tuple[Tensor, Tensor, Tensor]:
    """Heatmap [C, S, S] with elliptical Gaussians, box regression [4, S, S] and its mask [1, S, S]."""
    s = OUTPUT_SIZE
    heat = np.zeros((len(CLASSES), s, s), dtype=np.float32)
    reg = np.zeros((4, s, s), dtype=np.float32)
    mask = np.zeros((1, s, s), dtype=np.float32)
    grid = np.arange(s, dtype=np.float32)
    sx = INPUT_SIZE / width / STRIDE  # original pixels -> output cells
    sy = INPUT_SIZE / height / STRIDE
    for b in boxes:
        cx = (b.x1 + b.x2) / 2.0 * sx
        cy = (b.y1 + b.y2) / 2.0 * sy
        bw = (b.x2 - b.x1) * sx
        bh = (b.y2 - b.y1) * sy
        ix = min(int(cx), s - 1)
        iy = min(int(cy), s - 1)
        sigma_x = max(0.54 * bw / 6.0, 0.4)
        sigma_y = max(0.54 * bh / 6.0, 0.4)
        gx = np.exp(-((grid - ix) ** 2) / (2 * sigma_x**2))
        gy = np.exp(-((grid - iy) ** 2) / (2 * sigma_y**2))
        np.maximum(heat[b.label_id], gy[:, None] * gx[None, :], out=heat[b.label_id])
        heat[b.label_id, iy, ix] = 1.0
        reg[:, iy, ix] = (math.log(bw), math.log(bh), cx - ix, cy - iy)
        mask[0, iy, ix] = 1.0
    return torch.from_numpy(heat), torch.from_numpy(reg), torch.from_numpy(mask)


def scene_batches(seed: int, batch_size: int, jpeg_probability: float = 0.3) -> Iterator[tuple[Tensor, ...]]:
    """Endless deterministic stream of (images, heatmaps, box targets, box masks) batches.

    Scenes come from demo.shapes.render_scene with the same size/aspect distribution as the eval set.
    Big scenes are rendered smaller (same aspect ratio; shape sizes are relative to the image): the model
    stretches everything to 256x256 anyway and rendering 1280x720 would cost about as much as a training
    step. The downscale to the input size is PIL's antialiased bilinear resize, which matches the model's
    F.interpolate(..., antialias=True) up to uint8 rounding. Some scenes take a JPEG round trip, as the
    worker reads JPEG files.
    """
    rng = random.Random(seed)
    while True:
        items: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        for _ in range(batch_size):
            width, height = random_image_size(rng)
            scale = min(1.0, RENDER_MAX_SIDE / max(width, height))
            width, height = round(width * scale), round(height * scale)
            image, boxes = render_scene(rng, width, height)
            if rng.random() < jpeg_probability:
                buffer = io.BytesIO()
                image.save(buffer, "JPEG", quality=rng.randint(75, 95))
                buffer.seek(0)
                image = Image.open(buffer).convert("RGB")
            small = image.resize((INPUT_SIZE, INPUT_SIZE), Image.Resampling.BILINEAR)
            items.append((image_to_tensor(small), *make_targets(boxes, width, height)))
        yield tuple(torch.stack([item[j] for item in items]) for j in range(4))


# ---------------------------------------------------------------------------------------------- loss


def focal_loss(logits: Tensor, target: Tensor) -> Tensor:
    """CenterNet's penalty-reduced pixel-wise focal loss, normalised by the number of objects."""
    pred = torch.sigmoid(logits).clamp(1e-4, 1.0 - 1e-4)
    pos = target.eq(1.0).to(pred.dtype)
    neg = 1.0 - pos
    pos_loss = torch.log(pred) * (1.0 - pred) ** 2 * pos
    neg_loss = torch.log(1.0 - pred) * pred**2 * (1.0 - target) ** 4 * neg
    num_pos = pos.sum().clamp(min=1.0)
    return -(pos_loss.sum() + neg_loss.sum()) / num_pos


def box_loss(pred: Tensor, target: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    num = mask.sum().clamp(min=1.0)
    diff = (pred - target).abs() * mask
    return diff[:, :2].sum() / num, diff[:, 2:].sum() / num


# ------------------------------------------------------------------------------------------- helpers


def to_predicted(output: dict[str, Tensor]) -> list[PredictedBox]:
    boxes = output["boxes"].tolist()
    return [
        PredictedBox(int(label), float(score), *box)
        for box, label, score in zip(boxes, output["labels"].tolist(), output["scores"].tolist(), strict=True)
    ]


def quick_eval(model: nn.Module, count: int, seed: int, threshold: float) -> str:
    rng = random.Random(seed)
    gt: dict[str, list[GroundTruthBox]] = {}
    pred: dict[str, list[PredictedBox]] = {}
    with torch.no_grad():
        for i in range(count):
            width, height = random_image_size(rng)
            image, boxes = render_scene(rng, width, height)
            gt[str(i)] = boxes
            pred[str(i)] = to_predicted(model([image_to_tensor(image)])[0])
    mean_ap, per_class = mean_average_precision(gt, pred, len(CLASSES))
    precision, recall, *_ = precision_recall(gt, pred, score_threshold=threshold)
    classes = " ".join(f"{name}={ap:.3f}" for name, ap in zip(CLASSES, per_class, strict=True))
    return f"mAP@0.5={mean_ap:.3f} ({classes}) P={precision:.3f} R={recall:.3f} @ {threshold}"


def save(detector: DemoDetector, meta: dict[str, object], out: Path) -> None:
    """Script the detector and save it with its detq.json."""
    scripted = torch.jit.script(detector)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(scripted, str(out), _extra_files={"detq.json": json.dumps(meta)})
    size = out.stat().st_size
    print(f"saved {out} ({size / 1e6:.2f} MB, {size} bytes)")


def rescript(source: Path, out: Path) -> None:
    """Save a trained file's weights and detq.json again, scripted from this file's code."""
    extra = {"detq.json": ""}
    trained = torch.jit.load(str(source), map_location="cpu", _extra_files=extra)
    net = ShapesNet(len(CLASSES)).eval()
    fuse_conv_bn(net)  # the trained file's layout: each BatchNorm folded into its convolution
    detector = DemoDetector(net).eval()
    detector.load_state_dict(trained.state_dict())
    save(detector, json.loads(extra["detq.json"]), out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the TorchScript file")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps (batch --batch-size)")
    parser.add_argument("--minutes", type=float, default=15.0, help="wall-clock cap; 0 = no limit")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--score-threshold", type=float, default=0.3, help="stored in detq.json")
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--val-count", type=int, default=100, help="held-out scenes for a final check")
    parser.add_argument(
        "--rescript",
        type=Path,
        help="save this file's weights and detq.json again with this code; no training",
    )
    args = parser.parse_args(argv)
    if args.rescript is not None:
        rescript(args.rescript, args.out)
        return 0

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)

    net = ShapesNet(len(CLASSES)).to(memory_format=torch.channels_last)
    params = sum(p.numel() for p in net.parameters())
    print(f"ShapesNet: {params / 1e6:.2f} M parameters, input {INPUT_SIZE}x{INPUT_SIZE}, stride {STRIDE}")
    decay = [p for p in net.parameters() if p.dim() > 1]
    no_decay = [p for p in net.parameters() if p.dim() <= 1]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}], lr=args.lr
    )
    warmup = min(100, args.steps // 10)
    budget_s = args.minutes * 60.0
    started = time.perf_counter()
    net.train()
    running: list[float] = []
    step = 0
    for step, (x, heat_t, reg_t, mask_t) in enumerate(scene_batches(args.seed, args.batch_size), start=1):
        if budget_s > 0 and time.perf_counter() - started > budget_s:
            step -= 1
            print(
                f"time cap of {args.minutes:g} min reached after {step} steps: stopping early (not annealed)"
            )
            break
        progress = step / args.steps
        lr = args.lr * (step / warmup if step <= warmup else 0.5 * (1.0 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        x = ((x - PIXEL_MEAN) / PIXEL_STD).contiguous(memory_format=torch.channels_last)
        heat_logits, box = net(x)
        hm = focal_loss(heat_logits, heat_t)
        size_loss, offset_loss = box_loss(box, reg_t, mask_t)
        loss = hm + size_loss + offset_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
        optimizer.step()
        running.append(float(loss.detach()))
        if step % args.log_every == 0 or step == 1:
            mean = sum(running) / len(running)
            running.clear()
            print(
                f"step {step:5d}/{args.steps} loss {mean:.4f} (heat {float(hm.detach()):.3f} "
                f"size {float(size_loss.detach()):.3f} offset {float(offset_loss.detach()):.3f}) lr {lr:.2e} "
                f"{time.perf_counter() - started:6.1f}s",
                flush=True,
            )
        if step >= args.steps:
            break
    train_s = time.perf_counter() - started
    print(f"trained {step} steps in {train_s:.1f}s ({train_s / 60:.1f} min)")

    net.eval()
    net = net.to(memory_format=torch.contiguous_format)
    fuse_conv_bn(net)
    detector = DemoDetector(net).eval()
    meta = {
        "name": "detq-demo-shapes",
        "format": "torchvision",
        "classes": list(CLASSES),
        "input_size": [INPUT_SIZE, INPUT_SIZE],
        "score_threshold": args.score_threshold,
        "trained_with": "scripts/train_demo_model.py",
        "seed": args.seed,
    }
    save(detector, meta, args.out)

    if args.val_count > 0:
        loaded = torch.jit.load(str(args.out), map_location="cpu")
        print("held-out check:", quick_eval(loaded, args.val_count, args.seed + 1000, args.score_threshold))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
