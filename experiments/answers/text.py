"""unicode1, unicode2, train_bpe_tinystories and tokenizer_experiments, answered from Python run here.

Every fact is computed when the answers are generated (reprs, encoded lengths, decode errors, a BPE
vocabulary trained on a corpus the data root holds, compression ratios), never typed in. Timings are left
to the commands that measure them, so the generated page does not change from run to run.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

from experiments.answers.accounting import table
from jaxlm.core.errors import DataError

SAMPLES = ("hello! こんにちは!", "The café served crème brûlée.", "Once upon a time, there was a little dog.")
BPE_VOCAB = 10_000
PILE_BYTES = 825e9
STAND_IN = ("wikitext-2", "test.txt")  # trains the stand-in vocabulary
HELD_OUT = (("wikitext-2", "valid.txt"), ("cs336", "tinystories_sample.txt"))


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
            f"(a) `chr(0)` is U+{ord(c):04X}, the NULL control character (Unicode category {unicodedata.category(c)}).", "",
            f"(b) Its `__repr__()` is `{c!r}`, an escape sequence of {len(repr(c))} visible characters; printing it writes "
            f"the one character itself ({c.encode()!r} in UTF-8), which a terminal shows as nothing.", "",
            f"(c) In text it is an ordinary character: `{text!r}` has {len(text)} characters, {len(text) - 1} of them "
            "visible; the repr shows it as `\\x00`, while `print` shows `this is a teststring`, the NUL invisible "
            "between the two words. It does not end the string as it would in C.", ""]


def encoding_rows() -> list[list[str]]:
    rows = []
    for s in SAMPLES:
        enc = {e: s.encode(e) for e in ("utf-8", "utf-16-le", "utf-32-le")}
        rows.append([f"`{s}`", str(len(s)), *(f"{len(b)} ({100 * b.count(0) / len(b):.0f}% zero)" for b in enc.values())])
    return rows


def unicode2() -> list[str]:
    wrong = "héllo".encode()
    return ["### unicode2", "",
            "(a) Bytes per string (share of zero bytes) in each encoding:", ""]\
        + table(["string", "characters", "UTF-8", "UTF-16", "UTF-32"], encoding_rows()) + [
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


def corpus_file(root: Path, where: tuple[str, str]) -> Path:
    path = root / where[0] / where[1]
    if not path.is_file():
        raise DataError(f"{path}: corpus '{where[0]}' not found; run `python -m jaxlm.data download {where[0]}` "
                        "(or point JAXLM_DATA at a folder that holds it)")
    return path


def compression(tokenizer, path: Path) -> float:
    """Bytes per token over the whole file."""
    text = path.read_text(encoding="utf-8")
    return len(text.encode()) / max(len(tokenizer.encode(text)), 1)


def stand_in_tokenizer(data_root: Path, scratch: Path):
    """A BPE_VOCAB byte-level BPE trained on the stand-in corpus (deterministic: the same merges every run)."""
    from jaxlm.data.bpe import train_and_save
    from jaxlm.data.tokenizer import Tokenizer

    train_and_save([str(corpus_file(data_root, STAND_IN))], BPE_VOCAB, ["<|endoftext|>"], scratch, num_workers=1,
                   progress=False)
    return Tokenizer.from_files(scratch / "vocab.json", scratch / "merges.txt", ["<|endoftext|>"])


def longest_tokens(tokenizer, n: int = 3) -> list[bytes]:
    return sorted(tokenizer.vocab.values(), key=lambda b: (-len(b), b))[:n]


def train_bpe_section(data_root: Path, tokenizer) -> list[str]:
    longest = longest_tokens(tokenizer)
    return ["### train_bpe_tinystories", "",
            "**TinyStories is not in the data root here.** The command that answers (a) and "
            "(b) on a machine that has it (`train-bpe` prints its time and MB/s, `/usr/bin/time -v` the peak memory, "
            "`cProfile` where the time goes):", "",
            "```bash\npython -m jaxlm.data download tinystories\n"
            "/usr/bin/time -v python -m jaxlm.data train-bpe --input tinystories --vocab-size 10000 --out runs/bpe-tinystories\n"
            "python -m cProfile -s cumtime -m jaxlm.data train-bpe --input tinystories --vocab-size 10000 --out runs/bpe-ts "
            "--workers 1 | head -30\n```", "",
            f"The same trainer on a stand-in here, WikiText-2's test split ({corpus_file(data_root, STAND_IN).stat().st_size:,} "
            f"bytes), to {BPE_VOCAB:,} entries: its longest tokens are "
            + ", ".join(f"`{t.decode('utf-8', 'replace')}` ({len(t)} bytes)" for t in longest)
            + ". They make sense: long words frequent in Wikipedia articles, each with the leading space the GPT-2 "
            "pre-tokeniser keeps. (b) The trainer has two phases, the pre-tokenisation (a regex over every byte, in "
            "parallel worker processes, one chunk of the file each, cut at `<|endoftext|>`) and the merges (over the "
            "counted distinct pre-tokens, with an index of pair counts updated per merge); the `cProfile` line above "
            "gives the split between them.", ""]


def tokenizer_section(data_root: Path, tokenizer) -> list[str]:
    from jaxlm.data.tokenizer import load_tokenizer

    gpt2 = load_tokenizer("gpt2")
    rows = []
    for where in HELD_OUT:
        path = corpus_file(data_root, where)
        rows.append([f"{where[0]}/{where[1]}", f"{compression(tokenizer, path):.2f}", f"{compression(gpt2, path):.2f}"])
    valid = corpus_file(data_root, HELD_OUT[0])
    n = len(tokenizer.encode(valid.read_text(encoding="utf-8")))
    return ["### tokenizer_experiments", "",
            "TinyStories and OpenWebText are not in the data root here, so the tokenizers are the stand-in above "
            f"({BPE_VOCAB:,} entries, trained on WikiText-2 test) and GPT-2's ({gpt2.vocab_size:,} entries, trained on "
            "WebText), on held-out text: WikiText-2 validation and the CS336 TinyStories sample. Compression ratio in "
            "bytes per token (higher compresses better):", ""]\
        + table(["text", f"stand-in BPE ({BPE_VOCAB // 1000}K)", "GPT-2 (50K)"], rows) + [
            f"(a) On text like its training data (WikiText-2 validation) the stand-in gets {rows[0][1]} bytes per token "
            f"against GPT-2's {rows[0][2]}. (b) On TinyStories text it gets {rows[1][1]} against GPT-2's {rows[1][2]}: "
            "a vocabulary fitted to one domain spends entries on that domain's words (here Wikipedia's) and splits "
            "the other domain's common words into more pieces.", "",
            "(c) Throughput is measured by `python -m jaxlm.bench data` (tokenizer and `prepare` in MB/s, "
            f"docs/benchmarks.md); the Pile's {PILE_BYTES / 1e9:.0f} GB then takes {PILE_BYTES / 1e6 / 86400:.2f} days "
            f"divided by the throughput in MB/s (at 10 MB/s: {PILE_BYTES / 10e6 / 3600:.0f} hours).", "",
            f"(d) Token ids are stored as `uint16`: every id of both vocabularies is below 2^16 = 65,536 (the largest "
            f"here {max(tokenizer.vocab)} and {gpt2.vocab_size - 1}), so two bytes per token suffice, half of int32: "
            f"WikiText-2 validation becomes {n:,} tokens, {2 * n:,} bytes. `python -m jaxlm.data prepare` picks "
            "uint16 whenever the vocabulary fits, uint32 otherwise.", ""]


def text_sections(data_root: Path, scratch: Path) -> list[str]:
    tokenizer = stand_in_tokenizer(data_root, scratch)
    return unicode1() + unicode2() + train_bpe_section(data_root, tokenizer) + tokenizer_section(data_root, tokenizer)
