"""BPE training: the CS336 reference, a brute-force trainer, parallel == serial, file format."""

import json
from collections import Counter

import pytest
import regex

from jaxlm.data import bpe, chunks
from jaxlm.data.bpe import (
    GPT2_PATTERN,
    DataError,
    load_vocab_merges,
    save_vocab_merges,
    str_to_token,
    train_bpe,
)

EOT = "<|endoftext|>"


def _reference(cs336):
    reference = json.loads((cs336 / "train-bpe-reference-vocab.json").read_text(encoding="utf-8"))
    vocab = {i: str_to_token(s) for s, i in reference.items()}
    lines = (cs336 / "train-bpe-reference-merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [tuple(str_to_token(t) for t in line.split(" ")) for line in lines if line]
    return vocab, merges


def test_reference_vocab_and_merges_exactly(cs336):
    ref_vocab, ref_merges = _reference(cs336)
    vocab, merges = train_bpe(cs336 / "corpus.en", 500, [EOT])  # its speed: python -m jaxlm.bench data
    assert merges == ref_merges
    assert vocab == ref_vocab  # ids too: specials, then bytes in GPT-2 order, then merges


def _brute_force_bpe(text: str, vocab_size: int, specials: list[str]):
    """Recount every pair from scratch after each merge: slow and obviously right."""
    pieces = regex.split("|".join(regex.escape(s) for s in specials), text) if specials else [text]
    words = Counter()
    for p in pieces:
        words.update(tuple(bytes([b]) for b in w.encode()) for w in regex.findall(GPT2_PATTERN, p))
    merges = []
    while 256 + len(specials) + len(merges) < vocab_size:
        pairs = Counter()
        for w, f in words.items():
            for pair in zip(w, w[1:]):
                pairs[pair] += f
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        new_words = Counter()
        for w, f in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] += f
        words = new_words
    return merges


def test_matches_brute_force_with_ties(tmp_path, cs336):
    # Small text, many equal counts: exercises the tie-break (greater pair of byte strings).
    text = (cs336 / "tinystories_sample.txt").read_text(encoding="utf-8")
    text += " aaaa bbbb aaaa bbbb zz yy zz yy ééé ééé 😀😀 x\u00a0y \n\n  tail  "
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    _, merges = train_bpe(path, 256 + 1 + 150, [EOT])
    assert merges == _brute_force_bpe(text, 256 + 1 + 150, [EOT])


def test_parallel_equals_serial(cs336, monkeypatch):
    path = cs336 / "corpus.en"
    serial = train_bpe(path, 600, [EOT], num_workers=1)
    # Force many small chunks and worker processes on this small file.
    monkeypatch.setattr(bpe, "_PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(bpe, "_CHUNK_BYTES", 4096)
    assert train_bpe(path, 600, [EOT], num_workers=2) == serial


def test_chunk_boundaries_are_safe(tmp_path):
    text = ("word  \n\n  more<|endoftext|>x y\u00a0 z" * 500) + "end"
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    ranges = chunks.file_chunks([path], [EOT.encode()], chunk_bytes=97)
    assert len(ranges) > 10
    assert "".join(chunks.read_chunk(*c) for c in ranges) == text
    whole = bpe._count_pretokens((str(path), 0, path.stat().st_size, [EOT]))
    parts = Counter()
    for c in ranges:
        parts.update(bpe._count_pretokens((*c, [EOT])))
    assert parts == whole


def test_special_tokens_are_never_merged(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("ab<|endoftext|>ab<|endoftext|>" * 50, encoding="utf-8")
    vocab, merges = train_bpe(path, 300, [EOT])
    assert vocab[0] == EOT.encode()
    assert all(b"<|" not in a + b for a, b in merges)


def test_save_load_roundtrip(tmp_path, cs336):
    vocab, merges = train_bpe(cs336 / "corpus.en", 400, [EOT])
    vp, mp_ = save_vocab_merges(tmp_path, vocab, merges)
    assert mp_.read_text(encoding="utf-8").startswith("#version: 0.2\n")
    assert load_vocab_merges(vp, mp_) == (vocab, merges)


def test_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="missing.txt"):
        train_bpe(tmp_path / "missing.txt", 300, [EOT])
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"hello \xff\xfe world")
    with pytest.raises(DataError, match="bad.txt.*UTF-8"):
        train_bpe(bad, 300, [EOT])


def test_cli_train_bpe(tmp_path, cs336, capsys):
    from jaxlm.cli.data import main

    assert main(["train-bpe", "--input", str(cs336 / "corpus.en"), "--vocab-size", "500", "--out", str(tmp_path)]) == 0
    assert "vocab 500" in capsys.readouterr().out
    assert json.loads((tmp_path / "special_tokens.json").read_text()) == [EOT]
    assert load_vocab_merges(tmp_path / "vocab.json", tmp_path / "merges.txt") == _reference(cs336)
