"""`python -m deliverables.gpu.merge DIR`: an offline GPU run's results into the committed GPU report, its calibration
into the GPU's committed calibration (docs/gpu.md)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from deliverables.gpu import campaign
from deliverables.gpu.profile import CALIBRATION_FILE
from jaxlm import cli
from jaxlm.analysis.devices import DEVICES
from jaxlm.core.errors import DataError, UsageError
from jaxlm.core.files import read_json
from jaxlm.predict.calibration import CALIBRATIONS, load, save

PROG = "python -m deliverables.gpu.merge"
PROFILE_FILES = ("profile_train_step.trace.json.gz", "profile_train_step.hlo.txt.gz")


def _read(path: Path) -> dict:
    data = read_json(path, default=None)
    if not isinstance(data, dict) or not isinstance(data.get("steps"), dict) or "meta" not in data:
        raise DataError(f"{path}: missing, or not a GPU campaign's results.json (no meta and steps); give the folder "
                        "the offline run's files came back to")
    return data


def merge(source: Path, into: Path, calibrations: Path = CALIBRATIONS) -> list[str]:
    """The steps of source/results.json merged into into/ (report rewritten), its calibration into
    `calibrations`; the names merged."""
    new = _read(source / "results.json")
    if new["meta"].get("smoke"):
        raise UsageError(f"{source / 'results.json'}: a --smoke run's tiny-model figures never go into {into}/")
    record = read_json(source / "offline.json", default={})
    stamp = {"device": new["meta"].get("device"), "jax": new["meta"].get("jax"), "started": record.get("started")}
    old = _read(into / "results.json")["steps"] if (into / "results.json").is_file() else {}
    steps = {**old, **{name: {**res, "measured_by": stamp} for name, res in new["steps"].items()}}
    rows = [(step, step.estimate(False), "no call has run it yet") for step in campaign.steps()]
    into.mkdir(parents=True, exist_ok=True)
    campaign.write_report(into, steps, rows, new["meta"])
    if record:
        shutil.copyfile(source / "offline.json", into / "offline.json")
    for name in PROFILE_FILES:
        if (source / name).is_file():
            (into / "profile").mkdir(exist_ok=True)
            shutil.copyfile(source / name, into / "profile" / name)
    if (source / CALIBRATION_FILE).is_file():
        cal = load(source / CALIBRATION_FILE)
        if cal.device not in DEVICES:
            raise DataError(f"{source / CALIBRATION_FILE}: measured on {cal.device}, a GPU the device table lacks")
        calibrations.mkdir(parents=True, exist_ok=True)
        save(cal, calibrations / f"{cal.device}.json")
    return list(new["steps"])


def main(argv: list[str]) -> int:
    parser = cli.ArgumentParser(command="deliverables.gpu.merge", description=__doc__,
                                formatter_class=cli.HelpFormatter)
    parser.add_argument("source", metavar="DIR", help="the folder holding the offline run's results.json (its $OUT)")
    parser.add_argument("--into", help=f"the report's folder (default: {campaign.DEFAULT_OUT} of this repository)")
    parser.add_argument("--calibrations", default=str(CALIBRATIONS), help="where the GPU's calibration goes "
                        "(default: the package's committed calibrations, jaxlm.predict.calibration.CALIBRATIONS)")
    args = parser.parse_args(argv)
    into = Path(args.into) if args.into else campaign.REPO / campaign.DEFAULT_OUT
    names = merge(Path(args.source), into, Path(args.calibrations))
    print(f"merged {', '.join(names) or 'no step'} from {args.source} into {into}; wrote {into / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
