"""The first GPU calibrates every later prediction: measured over predicted time per kernel group and per shape
class (GEMMs by their waves, attention forward and backward), fitted on a profiled step and applied to every
kernel priced afterwards.

    cal = fit(prediction, measured, "h100-80gb", source="python -m deliverables.gpu --only profile")
    save(cal, Path("calibration.json")); predict(text, rates, load(Path("calibration.json")))

The GPU campaign's `profile` step (deliverables.gpu.profile) matches a trace's kernels to the program's and
writes one; committed as CALIBRATIONS/DEVICE.json it is what every `--target DEVICE` command applies by default
(`resolve`, which says so in the prediction's label; `--calibration FILE` or `none` overrides). A kernel is scaled
by its shape class's ratio where the calibration has one, else by its group's, else not at all. A calibration is
fitted to one version of the pricing model (jaxlm.predict.roofline.PRICING_VERSION); another version refuses it.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jaxlm.core.errors import DataError, UsageError
from jaxlm.core.files import write_json
from jaxlm.predict.roofline import PRICING_VERSION, Prediction

CALIBRATIONS = Path(__file__).parent / "calibrations"  # DEVICE.json: committed calibrations, found by device name


@dataclass(frozen=True)
class Ratio:
    measured_ms: float
    predicted_ms: float

    @property
    def ratio(self) -> float:
        return self.measured_ms / self.predicted_ms


@dataclass(frozen=True)
class Calibration:
    device: str  # the device table's name of the GPU it was measured on
    date: str
    source: str  # what was profiled
    groups: dict[str, Ratio] = field(default_factory=dict)
    shape_classes: dict[str, Ratio] = field(default_factory=dict)
    pricing: int = PRICING_VERSION
    path: str = ""  # where it was read from

    def factor(self, group: str, shape_class: str | None) -> float:
        """Measured over predicted for a kernel of `group` and `shape_class`: the class's, else the group's, else 1."""
        ratio = self.shape_classes.get(shape_class) or self.groups.get(group)
        return ratio.ratio if ratio else 1.0

    @property
    def label(self) -> str:
        return f"calibrated by {self.path or 'a calibration'} (measured on {self.device}, {self.date})"

    def as_dict(self) -> dict:
        out = asdict(self)
        del out["path"]
        for key in ("groups", "shape_classes"):
            out[key] = {k: {**asdict(r), "ratio": r.ratio} for k, r in getattr(self, key).items()}
        return out


def fit(prediction: Prediction, measured: dict[str, float], device: str, source: str, date: str | None = None
        ) -> Calibration:
    """Measured over predicted per group and per shape class, over the kernels a measurement matched: `measured`
    maps a kernel's name to its measured seconds per program run (all its launches); `prediction` is
    uncalibrated."""
    groups: dict[str, list[float]] = {}
    classes: dict[str, list[float]] = {}
    for k in prediction.kernels:
        if k.name not in measured:
            continue
        for table, key in ((groups, k.group), (classes, k.shape_class)):
            if key:
                pair = table.setdefault(key, [0.0, 0.0])
                pair[0] += 1e3 * measured[k.name]
                pair[1] += 1e3 * k.total_seconds

    def ratios(table: dict[str, list[float]]) -> dict[str, Ratio]:
        return {k: Ratio(m, p) for k, (m, p) in sorted(table.items()) if m > 0 and p > 0}

    return Calibration(device, date or datetime.date.today().isoformat(), source, ratios(groups), ratios(classes))


def save(cal: Calibration, path: Path) -> Path:
    return write_json(path, cal.as_dict())


def load(path: Path) -> Calibration:
    """A calibration file, checked: one line naming the file and what is wrong otherwise."""
    try:
        data = json.loads(Path(path).read_text())
        tables = {key: {k: Ratio(float(v["measured_ms"]), float(v["predicted_ms"])) for k, v in data[key].items()}
                  for key in ("groups", "shape_classes")}
        cal = Calibration(str(data["device"]), str(data["date"]), str(data["source"]), **tables,
                          pricing=int(data["pricing"]), path=str(path))
    except OSError as e:
        raise DataError(f"--calibration {path}: cannot read it ({e.strerror or e})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        what = f"no key {e}" if isinstance(e, KeyError) else str(e).splitlines()[0][:120]
        raise DataError(f"--calibration {path}: not a calibration file ({what})") from None
    if cal.pricing != PRICING_VERSION:
        raise DataError(f"--calibration {path}: fitted to pricing version {cal.pricing}, the model is at "
                        f"{PRICING_VERSION}: profile the GPU again (docs/gpu.md, the `profile` step)")
    if any(r.ratio <= 0 for table in (cal.groups, cal.shape_classes) for r in table.values()):
        raise DataError(f"--calibration {path}: a ratio is not positive")
    return cal


def committed(device: str) -> Path | None:
    path = CALIBRATIONS / f"{device}.json"
    return path if path.is_file() else None


def resolve(choice: str | None, device: str | None, log=None) -> Calibration | None:
    """The calibration a `--target` command applies: `choice` (--calibration FILE; "none": none), else the one
    committed for `device` (the device table's name), announced through `log`. A file measured on another GPU
    is refused."""
    if choice and choice.lower() == "none":
        return None
    path = Path(choice) if choice else committed(device) if device else None
    if path is None:
        return None
    cal = load(path)
    if device and cal.device != device:
        raise UsageError(f"--calibration {path}: measured on {cal.device}, the target is {device}; give one measured "
                         "on the target, or --calibration none")
    if not choice and log:
        log(f"predicted times {cal.label}, committed for {device} (--calibration none: without)")
    return cal
