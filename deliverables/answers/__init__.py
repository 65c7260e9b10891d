"""The curriculum's questions answered (docs/report.md): `python -m deliverables.answers`. The page's fixed prose is
deliverables/pages/answers.md, filled by `prose`; the modules compute what goes in it."""

from deliverables.common import render
from jaxlm.core import platform

platform.prepare()  # before its modules import JAX: CPU and a quiet start where a CUDA plugin has no GPU


def prose(name: str, **fields) -> list[str]:
    """Block `name` of deliverables/pages/answers.md filled by deliverables.common.render, as the page's lines (a
    blank line ends most blocks)."""
    return render("answers.md", name, **fields).split("\n")[:-1]
