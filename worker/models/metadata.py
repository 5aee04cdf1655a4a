"""What the worker knows of a model: output format, classes, input size, thresholds, and their source."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from detq.errors import DetqError
from detq.vocabulary import ModelFormat

MAX_INPUT_SIDE = 16384


class YoloDefaults(BaseModel):
    """Ultralytics' predict defaults (ultralytics/cfg/default.yaml) and its usual export size."""

    model_config = ConfigDict(frozen=True)

    score_threshold: float = 0.25
    iou_threshold: float = 0.7
    max_detections: int = 300
    input_size: tuple[int, int] = (640, 640)


# Also used for final-box models without thresholds of their own.
YOLO_DEFAULTS: Final = YoloDefaults()


class ModelMetaError(DetqError, ValueError):
    """The model's metadata is malformed; the message has one line per problem."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[str, ...] = tuple(problems) or (message,)

    @classmethod
    def from_validation(
        cls, exc: ValidationError, document: str = "", key: tuple[str, ...] = ()
    ) -> ModelMetaError:
        """One readable line per pydantic error, naming its key (under `key`, after `document` if given)."""
        lines = [_problem_line(error, document, key) for error in exc.errors()]
        return cls("\n".join(lines), lines)


def _key_path(loc: Iterable[int | str]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def _shown(value: Any) -> str:
    # Only short scalars: echoing a whole list or object back would not fit on one line.
    if isinstance(value, str | int | float | bool) and len(repr(value)) <= 60:
        return f", got {value!r}"
    return ""


_BOUNDS = {
    "less_than_equal": ("at most", "le"),
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("greater than", "gt"),
    "less_than": ("less than", "lt"),
}
_TYPES = {
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
}


def _problem(error: ErrorDetails) -> str:
    kind, ctx, got = error["type"], error.get("ctx", {}), _shown(error.get("input"))
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind == "json_invalid":
        return f"not valid JSON: {ctx.get('error', '')}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a JSON object, got {type(error.get('input')).__name__}"
    if kind == "enum":
        return f"must be one of {ctx.get('expected', '')}{got}"
    if kind == "missing":
        return "is required"
    if kind == "greater_than" and ctx.get("gt") == 0:
        return f"must be positive{got}"
    if kind in _BOUNDS:
        words, bound = _BOUNDS[kind]
        limit = ctx.get(bound)
        return f"must be {words} {limit:g}{got}" if isinstance(limit, int | float) else error["msg"]
    if kind in _TYPES:
        return _TYPES[kind] + got
    message = error["msg"].splitlines()[0]
    return message[:1].lower() + message[1:]


def _problem_line(error: ErrorDetails, document: str, prefix: tuple[str, ...]) -> str:
    key = _key_path((*prefix, *error["loc"]))
    if key:
        where = f"{document} '{key}'" if document else f"'{key}'"
    else:
        where = document or "model metadata"
    return f"{where}: {_problem(error)}"


def _size_pair(value: Any) -> Any:
    """[height, width], one int (square), or "H,W" / "HxW" / "S" text, as a pair; sides are checked after."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        parts = [p.strip() for p in value.replace("x", ",").split(",") if p.strip()]
        try:
            value = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"{value!r} is not 'H,W' or a single number") from None
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, list | tuple) and len(value) in (1, 2):
        return (value[0], value[-1])
    raise ValueError("must be [height, width] in pixels, one number for a square, or 'H,W' text")


def _three_numbers(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (value,) * 3
    if value is None or (isinstance(value, list | tuple) and len(value) == 3):
        return value
    raise ValueError("must be a number or a list of 3 numbers")


Side = Annotated[int, Strict(), Field(gt=0, le=MAX_INPUT_SIDE)]
InputSize = Annotated[tuple[Side, Side] | None, BeforeValidator(_size_pair)]
Threshold = Annotated[float, Strict(), Field(ge=0.0, le=1.0)]
Count = Annotated[int, Strict(), Field(gt=0)]
Triple = Annotated[tuple[Annotated[float, Strict()], ...] | None, BeforeValidator(_three_numbers)]

_INPUT_SIZE: Final = TypeAdapter[tuple[int, int] | None](InputSize)


class ModelMeta(BaseModel):
    """Resolved metadata of a model: from detq.json, config.txt or a sidecar, then settings overrides."""

    # Extra keys are ignored: detq.json files in the wild carry keys of other tools.
    model_config = ConfigDict(frozen=True, extra="ignore")

    format: ModelFormat | None = None
    classes: tuple[Annotated[str, Strict()], ...] = ()
    input_size: InputSize = None
    letterbox: Annotated[bool, Strict()] = True
    mean: Triple = None
    std: Triple = None
    score_threshold: Threshold | None = None
    iou_threshold: Threshold | None = None
    max_detections: Count | None = None
    # Detections of only these classes are kept (names, or label ids as text): a job's --classes.
    keep_classes: tuple[Annotated[str, Strict()], ...] = ()
    name: Annotated[str, Strict()] | None = None
    source: str = "none"

    @property
    def fixed_input(self) -> bool:
        """True when the format is known and takes a letterboxed [B, 3, H, W] batch."""
        return self.format is not None and self.format.fixed_input

    def label_name(self, label_id: int) -> str:
        """Class name of a label id, or its number when the model carries no name for it."""
        if 0 <= label_id < len(self.classes):
            return self.classes[label_id]
        return str(label_id)

    @property
    def kept_label_ids(self) -> frozenset[int] | None:
        """The label ids keep_classes names (by class name or by number); None: every class is kept."""
        if not self.keep_classes:
            return None
        named = {index for index, name in enumerate(self.classes) if name in self.keep_classes}
        return frozenset(named | {int(c) for c in self.keep_classes if c.isdigit()})

    def fixed_input_size(self) -> tuple[int, int]:
        """(height, width) fed to fixed-input models."""
        return self.input_size or YOLO_DEFAULTS.input_size

    def yolo_thresholds(self) -> tuple[float, float, int]:
        """(score threshold, IoU threshold, max detections), Ultralytics' defaults where unset."""
        return (
            YOLO_DEFAULTS.score_threshold if self.score_threshold is None else self.score_threshold,
            YOLO_DEFAULTS.iou_threshold if self.iou_threshold is None else self.iou_threshold,
            YOLO_DEFAULTS.max_detections if self.max_detections is None else self.max_detections,
        )

    def with_yolo_defaults(self) -> ModelMeta:
        """Fill unset thresholds with Ultralytics' predict defaults."""
        score, iou, max_det = self.yolo_thresholds()
        return self.model_copy(
            update={"score_threshold": score, "iou_threshold": iou, "max_detections": max_det}
        )

    def with_format(self, fmt: ModelFormat | str) -> ModelMeta:
        """The same metadata with its format settled (a format name is checked against ModelFormat)."""
        return self.model_copy(update={"format": ModelFormat(fmt)})

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, in detq.json vocabulary."""
        return self.model_dump(mode="json")


def parse_input_size(value: Any) -> tuple[int, int] | None:
    """[height, width], a single int (square), or "H,W" / "S" text; None or "" for none."""
    try:
        return _INPUT_SIZE.validate_python(value)
    except ValidationError as exc:
        raise ModelMetaError.from_validation(exc, key=("input_size",)) from None


def parse_model_meta(raw: Mapping[str, Any], source: str = "detq.json") -> ModelMeta:
    """Validate a detq.json-style dict into ModelMeta; ModelMetaError lists every problem, one a line."""
    # Where it came from is ours to say, not the file's.
    data = {**raw, "source": source}
    try:
        return ModelMeta.model_validate(data)
    except ValidationError as exc:
        raise ModelMetaError.from_validation(exc) from None


def sidecar_paths(model_path: Path) -> list[Path]:
    """model.pt -> model.json, model.pt.json."""
    return [model_path.with_suffix(".json"), model_path.with_name(model_path.name + ".json")]


def load_json_object(path: Path, name: str) -> dict[str, Any]:
    """The JSON object in a metadata file; ModelMetaError naming it (as `name`) otherwise."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ModelMetaError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ModelMetaError(f"{name} must hold a JSON object")
    return loaded


def read_sidecar(model_path: Path) -> tuple[dict[str, Any], str] | None:
    """The first sidecar JSON next to the model, with its name, or None."""
    for candidate in sidecar_paths(model_path):
        if candidate.is_file():
            return load_json_object(candidate, f"sidecar {candidate.name}"), f"sidecar {candidate.name}"
    return None


class MetaOverrides(BaseModel):
    """Settings and CLI flags that win over whatever the model file says.

    Values are validated like detq.json's at construction, so `apply` can copy them in unchecked.
    """

    # Forbid, not ignore: these come from code, where an unknown name is a typo.
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: ModelFormat | None = None
    input_size: InputSize = None
    score_threshold: Threshold | None = None
    iou_threshold: Threshold | None = None
    max_detections: Count | None = None

    def apply(self, meta: ModelMeta) -> ModelMeta:
        """Meta with every override that is set."""
        changes = self.model_dump(exclude_none=True)
        return meta.model_copy(update=changes) if changes else meta
