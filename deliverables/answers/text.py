"""unicode1 and unicode2 answered from Python run here (reprs, encoded lengths, decode errors), and
train_bpe_tinystories and tokenizer_experiments from the `tokenizer` plan's report (its records' numbers)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

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
    c = chr(0)
    text = "this is a test" + c + "string"
    return ["### unicode1", "",
            f"(a) `chr(0)` is U+{ord(c):04X}, the NULL control character "
            f"(Unicode category {unicodedata.category(c)}).", "",
            f"(b) Its `__repr__()` is `{c!r}`, an escape sequence of {len(repr(c))} visible characters; printing it "
            f"writes the one character itself ({c.encode()!r} in UTF-8), which a terminal shows as nothing.", "",
            f"(c) In text it is an ordinary character: `{text!r}` has {len(text)} characters, {len(text) - 1} of them "
            "visible; the repr shows it as `\\x00`, while `print` shows `this is a teststring`, the NUL invisible "
            "between the two words. It does not end the string as it would in C.", ""]


def unicode2() -> list[str]:
    wrong = "héllo".encode()
    rows = []
    for s in SAMPLES:
        enc = [s.encode(e) for e in ("utf-8", "utf-16-le", "utf-32-le")]
        rows.append([f"`{s}`", str(len(s)), *(f"{len(b)} ({100 * b.count(0) / len(b):.0f}% zero)" for b in enc)])
    return ["### unicode2", "",
            "(a) Bytes per string (share of zero bytes) in each encoding:", ""]\
        + [table(["string", "characters", "UTF-8", "UTF-16", "UTF-32"], rows, "lr"), ""] + [
            "UTF-8 is the shortest for text that is mostly ASCII, with no zero bytes, so a byte-level tokenizer sees "
            "shorter sequences and spends no merges on padding zeros; UTF-16 and UTF-32 spend two or four bytes on "
            "every ASCII character, and which byte order they use (and a byte-order mark) is one more thing to get "
            "wrong. UTF-8 is also what most text on the web is stored in.", "",
            f"(b) It decodes each byte on its own, but a character above U+007F takes 2 to 4 bytes that are only valid "
            f"together. `{wrong!r}` (`'héllo'`) {decode_error(wrong, decode_utf8_bytes_to_str_wrong)}: the lead byte "
            "of `é` cannot be decoded without its continuation byte. ASCII-only input hides the bug.", "",
            f"(c) `b'\\x80\\x80'` {decode_error(bytes([0x80, 0x80]))}: 0x80 is a continuation byte (10xxxxxx) with no "
            f"lead byte before it. Likewise `b'\\xc3\\x28'` {decode_error(bytes([0xC3, 0x28]))}: 0xc3 announces a "
            "two-byte character but 0x28 is no continuation byte.", ""]


def report_subsections(page: Path) -> dict[str, list[str]]:
    """'### TITLE' -> its lines, inside the '## Tokenizer experiments' section of the tokenizer plan's report."""
    found = re.search(rf"^## {SECTION}\n(.*?)(?=^## |\Z)", page.read_text(), re.M | re.S) if page.is_file() else None
    parts = re.split(r"^### (.*)\n", found.group(1), flags=re.M) if found else []
    return {title: body.splitlines() for title, body in zip(parts[1::2], parts[2::2])}


def tokenizer_sections(root: Path) -> list[str]:
    """train_bpe_tinystories and tokenizer_experiments from the `tokenizer` plan's report (its records' numbers)."""
    page = root / PLAN / "report.md"
    parts = report_subsections(page)
    link = f"[results/{PLAN}/report.md](results/{PLAN}/report.md)"
    if not parts:
        missing = [f"**Missing**: no `{PLAN}` plan report under `{root}`; `python -m experiments.run {PLAN}` then "
                   f"`python -m deliverables.report runs/{PLAN} --out {root}/{PLAN} --records`.", ""]
        return ["### train_bpe_tinystories", "", *missing, "### tokenizer_experiments", "", *missing]
    def take(title: str) -> list[str]:
        lines = parts.get(title, ["(missing from the report)", ""])
        return lines[next((i for i, ln in enumerate(lines) if ln.strip()), 0):]

    return (["### train_bpe_tinystories", "",
             f"From the `{PLAN}` plan ({link}). TinyStories and OpenWebText are not on this machine, so the plan "
             "trains the same trainer on the largest text here at four sizes, times each phase, profiles it, and "
             "extrapolates to TinyStories (a) by the fits it states; (b), where the time goes, is the "
             "merge/pre-tokenise split and the profile below. The longest tokens (last column) are whole words with "
             "the leading space the GPT-2 pre-tokeniser keeps: long words frequent in the training text, as "
             "expected.", ""] + take("BPE training")
            + ["### tokenizer_experiments", "", f"From the same plan ({link}). (a), (b) compression, our BPEs "
               "(trained on WikiText-2) against GPT-2's on in-domain and out-of-domain text:", ""]
            + take("Bytes per token") + ["(c) Throughput, and the Pile:", ""] + take("Encoding throughput")
            + ["(d) uint16:", ""] + take("Why uint16"))
