"""The curriculum's questions answered (docs/report.md): `python -m deliverables.answers`. The page's fixed prose is
answers.template.md, a block per `<!-- name -->` line, filled by `prose`; the modules compute what goes in it."""

import re
from pathlib import Path

from jaxlm.core import platform

platform.prepare()  # before its modules import JAX: CPU and a quiet start where a CUDA plugin has no GPU

TEMPLATE = Path(__file__).with_name("answers.template.md")


def prose(name: str, **fields) -> list[str]:
    """Block `name` of the template filled by str.format, as the page's lines (a blank line ends most blocks). A
    field may be lines (joined); an empty one leaves no blank lines behind (a paragraph only some records have)."""
    parts = re.split(r"^<!-- (\w+) -->\n", TEMPLATE.read_text(), flags=re.M)
    fields = {k: "\n".join(v) if isinstance(v, list) else v for k, v in fields.items()}
    text = dict(zip(parts[1::2], parts[2::2]))[name].format(**fields)
    return re.sub(r"\n{3,}", "\n\n", text).split("\n")[:-1]
