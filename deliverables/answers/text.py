"""unicode1 and unicode2 from Python run here; train_bpe_tinystories and tokenizer_experiments from the
`tokenizer` plan's report."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from deliverables.answers import prose
from deliverables.common import table

SAMPLES = ("hello! こんにちは!", "The café served crème brûlée.", "Once upon a time, there was a little dog.")
PLAN, SECTION = "tokenizer", "Tokenizer experiments"  # experiments/plans/tokenizer.toml and its report's section


def decode_utf8_bytes_to_str_wrong(bytestring: bytes) -> str:
    """The question's incorrect decoder: one byte at a time."""
    return "".join([bytes([b]).decode("utf-8") for b in bytestring])


def decode_error(data: bytes, decoder=lambda b: b.decode("utf-8")) -> str:
    try:
        return f"decodes to {decoder(data)!r}"
    except UnicodeDecodeError as e:
        return f"raises UnicodeDecodeError: {e.reason} (byte 0x{e.object[e.start]:02x})"


def unicode1() -> list[str]:
    nul = chr(0)
    text = "this is a test" + nul + "string"
    return prose("unicode1", code=ord(nul), category=unicodedata.category(nul), nul=nul, nul_repr=len(repr(nul)),
                 utf8=nul.encode(), text=text, length=len(text), visible=len(text) - 1)


def unicode2() -> list[str]:
    wrong = "héllo".encode()
    rows = []
    for s in SAMPLES:
        enc = [s.encode(e) for e in ("utf-8", "utf-16-le", "utf-32-le")]
        rows.append([f"`{s}`", str(len(s)), *(f"{len(b)} ({100 * b.count(0) / len(b):.0f}% zero)" for b in enc)])
    return prose("unicode2", table=table(["string", "characters", "UTF-8", "UTF-16", "UTF-32"], rows, "lr"),
                 wrong=wrong, wrong_error=decode_error(wrong, decode_utf8_bytes_to_str_wrong),
                 lone_error=decode_error(bytes([0x80, 0x80])), lead_error=decode_error(bytes([0xC3, 0x28])))


def report_subsections(page: Path) -> dict[str, str]:
    """'### TITLE' -> its text, inside the '## Tokenizer experiments' section of the tokenizer plan's report."""
    found = re.search(rf"^## {SECTION}\n(.*?)(?=^## |\Z)", page.read_text(), re.M | re.S) if page.is_file() else None
    parts = re.split(r"^### (.*)\n", found.group(1), flags=re.M) if found else []
    return {title: body.lstrip("\n").removesuffix("\n") for title, body in zip(parts[1::2], parts[2::2])}


def tokenizer_sections(root: Path) -> list[str]:
    """train_bpe_tinystories and tokenizer_experiments from the `tokenizer` plan's report (its records' numbers)."""
    parts = report_subsections(root / PLAN / "report.md")
    if not parts:
        missing = prose("missing", plan=PLAN, what="plan report", root=root)
        return ["### train_bpe_tinystories", "", *missing, "### tokenizer_experiments", "", *missing]
    take = lambda title: parts.get(title, "(missing from the report)\n")
    return prose("tokenizer", plan=PLAN, link=f"[results/{PLAN}/report.md](results/{PLAN}/report.md)",
                 bpe=take("BPE training"), compression=take("Bytes per token"), throughput=take("Encoding throughput"),
                 uint16=take("Why uint16"))
