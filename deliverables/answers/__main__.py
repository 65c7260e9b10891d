"""`python -m deliverables.answers`: docs/report/answers.md, every question id of the curriculum with its answer."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from deliverables.answers import accounting, gpu, measured, prose, studies, text
from jaxlm import cli
from jaxlm.analysis.devices import DEVICES, Device
from jaxlm.core.config import PRESETS
from jaxlm.core.files import atomic_write

RESULTS, RUN_PAGE = Path("docs/results"), Path("docs/report/learning_curve/report.md")
DOCS, OUT = Path("docs"), Path("docs/report/answers.md")
LINK = re.compile(r"\]\((?![a-z]+:|#)([^)\s#]+)")  # a relative link's path, written relative to docs/


def answers(device: Device, root: Path = RESULTS, bench: Path | None = None, page: Path = RUN_PAGE,
            out_dir: Path = OUT.parent) -> str:
    """The page; its links, which the sections write relative to docs/, made relative to `out_dir`."""
    command = f"python -m deliverables.answers --device {device.name}" + (f" --bench {bench}" if bench else "")
    names = [*accounting.GPT2, *(n for n in PRESETS if n not in accounting.GPT2)]
    lines = prose("page", command=command, root=root)
    lines += text.unicode1() + text.unicode2() + text.tokenizer_sections(root)
    lines += accounting.parameters_section(names) + accounting.flops_section(names) + accounting.adamw_section()
    lines += accounting.time_section(device) + accounting.memory_section(names, root)
    lines += studies.learning_rate_section(root) + studies.generate_section(page, os.path.relpath(page, DOCS))
    lines += measured.benchmarking_section(root, bench) + gpu.nsys_section(root) + gpu.mixed_precision_section(root)
    lines += gpu.memory_profiling_section(root)
    return LINK.sub(lambda m: "](" + os.path.relpath(DOCS / m.group(1), out_dir), "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(command="deliverables.answers", formatter_class=cli.HelpFormatter,
                           description=__doc__)
    p.add_argument("--device", default="h100-80gb", choices=sorted(DEVICES),
                   help="the accelerator of the extra training-time rows (the questions' own are always answered)")
    p.add_argument("--results", metavar="ROOT", default=str(RESULTS), help="the committed records (a folder per plan)")
    p.add_argument("--run-page", metavar="FILE", default=str(RUN_PAGE),
                   help="a training run's page with its sample (generate)")
    p.add_argument("--bench", metavar="PATH", help="a `jaxlm.bench model --json` file (or its run directory) to add")
    p.add_argument("--out", metavar="FILE", help="write the page here (its links relative to it), not to stdout")
    args = p.parse_args(argv)
    out_dir = Path(args.out).parent if args.out else OUT.parent
    md = answers(DEVICES[args.device], Path(args.results), Path(args.bench) if args.bench else None,
                 Path(args.run_page), out_dir=out_dir)
    if args.out:
        atomic_write(args.out, md)
    print(args.out or md)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
