"""Tokenizer: GPT-2 ids against tiktoken, round trips, special tokens, streaming, memory."""

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest
import tiktoken
import tiktoken.load

from jaxlm.data import tokenizer as tokmod
from jaxlm.data.bpe import GPT2_PATTERN, DataError, save_vocab_merges, train_bpe
from jaxlm.data.tokenizer import Tokenizer, load_tokenizer

EOT = "<|endoftext|>"
FIXTURES = ["address.txt", "german.txt", "tinystories_sample.txt", "special_token_double_newlines_non_whitespace.txt",
            "special_token_trailing_newlines.txt"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def gpt2(cs336):
    return load_tokenizer("gpt2")


@pytest.fixture(scope="session")
def tiktoken_gpt2(cs336, tmp_path_factory):
    """tiktoken's own gpt2 Encoding, rebuilt offline: vocab.bpe is the version line + gpt2_merges.txt."""
    d = tmp_path_factory.mktemp("gpt2")
    merges = (cs336 / "gpt2_merges.txt").read_text(encoding="utf-8")
    (d / "vocab.bpe").write_text("#version: 0.2\n" + merges, encoding="utf-8")
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # no cache: read the local files
    try:
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(d / "vocab.bpe"), str(cs336 / "gpt2_vocab.json"))
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old
    return tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOT: 50256},
                             explicit_n_vocab=50257)


def test_gpt2_known_ids(gpt2):
    assert gpt2.encode("Hello, world!") == [15496, 11, 995, 0]
    assert gpt2.encode("Hello, world") == [15496, 11, 995]
    assert gpt2.encode(EOT) == [50256]
    assert gpt2.vocab_size == 50257 and gpt2.eot_id == 50256


@pytest.mark.parametrize("name", FIXTURES + ["corpus.en"])
def test_gpt2_equals_tiktoken(gpt2, tiktoken_gpt2, cs336, name):
    text = (cs336 / name).read_text(encoding="utf-8")
    assert gpt2.encode(text) == tiktoken_gpt2.encode(text, allowed_special="all")
    plain = load_tokenizer("gpt2")
    assert plain.decode(gpt2.encode(text)) == text


@pytest.mark.parametrize("specials", [None, [EOT], [EOT, EOT + EOT]])
@pytest.mark.parametrize("name", FIXTURES)
def test_round_trip_and_stream(cs336, name, specials):
    tok = Tokenizer.from_files(cs336 / "gpt2_vocab.json", cs336 / "gpt2_merges.txt", specials)
    text = (cs336 / name).read_text(encoding="utf-8")
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    with open(cs336 / name, encoding="utf-8") as f:
        assert list(tok.encode_iterable(f)) == ids


def test_overlapping_specials_longest_wins(cs336):
    tok = Tokenizer.from_files(cs336 / "gpt2_vocab.json", cs336 / "gpt2_merges.txt", [EOT, EOT + EOT])
    double = tok.special_ids[EOT + EOT]
    ids = tok.encode(f"Hello{EOT}{EOT}{EOT}x")
    assert ids.count(double) == 1 and ids.count(50256) == 1
    assert ids.index(double) < ids.index(50256)
    assert tok.decode(ids) == f"Hello{EOT}{EOT}{EOT}x"
    # Without specials the marker is ordinary text.
    assert 50256 not in Tokenizer.from_files(cs336 / "gpt2_vocab.json", cs336 / "gpt2_merges.txt").encode(EOT)


def test_stream_cuts_never_change_ids(gpt2, monkeypatch):
    # Tiny chunks so cuts land everywhere: whitespace runs, specials, non-breaking spaces.
    monkeypatch.setattr(tokmod, "_STREAM_CHUNK_CHARS", 7)
    rng = random.Random(0)
    atoms = ["a", "bc", " ", "  ", "\n", "\n\n", " \n", "\t", "\u00a0", "'s", "'ll", "12", "!?", "é", "😀", EOT, "<|",
             "endoftext", "|>"]
    for _ in range(30):
        text = "".join(rng.choice(atoms) for _ in range(300))
        pieces = []
        i = 0
        while i < len(text):
            n = rng.randint(1, 20)
            pieces.append(text[i : i + n])
            i += n
        assert list(gpt2.encode_iterable(pieces)) == gpt2.encode(text)


def test_decode_invalid_utf8_is_replacement(gpt2):
    ids = gpt2.encode("é")
    assert len(ids) == 1
    # Token 447 is the lone byte 0xe2 (start of a 3-byte sequence) in GPT-2.
    assert gpt2.decode([447]) == "\ufffd"
    assert gpt2.decode([447, 15496]) == "\ufffdHello"


def _naive_encode(text, merges, specials_ids, vocab):
    """Apply merges in list order to each pre-token: the definition tiktoken's ranks must reproduce."""
    import regex

    inverse = {v: k for k, v in vocab.items()}
    rank = {m: i for i, m in enumerate(merges)}
    out = []
    for word in regex.findall(GPT2_PATTERN, text):
        parts = [bytes([b]) for b in word.encode()]
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: rank.get((parts[i], parts[i + 1]), 1 << 30))
            if (parts[best], parts[best + 1]) not in rank:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        out += [inverse[p] for p in parts]
    return out


def test_trained_vocab_encodes_like_merge_list(cs336):
    vocab, merges = train_bpe(cs336 / "corpus.en", 500, [EOT])
    tok = Tokenizer(vocab, merges, [EOT])
    assert tok._rank_to_id is None  # ids follow merge order: no translation
    text = (cs336 / "tinystories_sample.txt").read_text(encoding="utf-8").replace(EOT, "")
    assert tok.encode(text) == _naive_encode(text, merges, {}, vocab)
    assert tok.eot_id == 0 and tok.decode(tok.encode(text)) == text


def test_permuted_ids_are_translated(cs336):
    """A vocabulary whose ids do not follow merge order still encodes by merge rank."""
    vocab, merges = train_bpe(cs336 / "corpus.en", 400, [EOT])
    ids = list(vocab)
    perm = ids[:]
    random.Random(1).shuffle(perm)
    remap = dict(zip(ids, perm))
    shuffled = {remap[i]: t for i, t in vocab.items()}
    tok, ref = Tokenizer(shuffled, merges, [EOT]), Tokenizer(vocab, merges, [EOT])
    assert tok._rank_to_id is not None
    text = "the quick brown fox, they said: 'it's 2024!'" + EOT + " and more"
    assert tok.encode(text) == [remap[i] for i in ref.encode(text)]
    assert tok.decode(tok.encode(text)) == text


def test_missing_special_is_appended(cs336):
    tok = Tokenizer.from_files(cs336 / "gpt2_vocab.json", cs336 / "gpt2_merges.txt", ["<|pad|>"])
    assert tok.special_ids["<|pad|>"] == 50257 and tok.vocab_size == 50258
    assert tok.encode("a<|pad|>") == [64, 50257]


def test_bytes_tokenizer():
    tok = load_tokenizer("bytes")
    assert tok.vocab_size == 257 and tok.eot_id == 256
    text = "héllo" + EOT + "😀"
    ids = tok.encode(text)
    assert ids == list("héllo".encode()) + [256] + list("😀".encode())
    assert tok.decode(ids) == text
    assert list(tok.encode_iterable(["hé", "llo<|endof", "text|>😀"])) == ids


def test_load_tokenizer_directory(tmp_path, cs336):
    vocab, merges = train_bpe(cs336 / "corpus.en", 300, [EOT])
    save_vocab_merges(tmp_path, vocab, merges)
    assert load_tokenizer(tmp_path).special_tokens == [EOT]  # inferred: <|endoftext|> is in the vocab
    (tmp_path / "special_tokens.json").write_text(json.dumps([]))
    assert load_tokenizer(tmp_path).eot_id is None
    with pytest.raises(DataError, match="nowhere"):
        load_tokenizer(tmp_path / "nowhere")


def test_gpt2_fallback_to_tiktoken(monkeypatch, tiktoken_gpt2, gpt2):
    tokmod._gpt2.cache_clear()
    monkeypatch.setattr(tokmod, "gpt2_files", lambda: None)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: tiktoken_gpt2)
    try:
        tok = load_tokenizer("gpt2")
        assert tok.encode("Hello, world!" + EOT) == [15496, 11, 995, 0, 50256]
        assert tok._rank_to_id is None and tok.vocab_size == 50257

        def offline(name):
            raise ConnectionError("no network")

        tokmod._gpt2.cache_clear()
        monkeypatch.setattr(tiktoken, "get_encoding", offline)
        with pytest.raises(DataError, match="python -m jaxlm.data download cs336"):
            load_tokenizer("gpt2")
    finally:
        tokmod._gpt2.cache_clear()


def test_light_imports():
    code = ("import sys, jaxlm.data.tokenizer, jaxlm.data.bpe, jaxlm.data; "
            "print(sorted(m for m in ('jax', 'grain', 'numpy', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


_MEMORY_SCRIPT = textwrap.dedent(
    """
    import hashlib, resource, sys
    from jaxlm.data.tokenizer import load_tokenizer
    tok = load_tokenizer("gpt2")
    path, mode = sys.argv[1], sys.argv[2]
    list(tok.encode_iterable(["warm up the code paths once. " * 1000]))
    vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vm + 8_000_000, resource.RLIM_INFINITY))
    h, n = hashlib.sha256(), 0
    with open(path, encoding="utf-8") as f:
        ids = tok.encode_iterable(f) if mode == "stream" else tok.encode(f.read())
        for i in ids:
            h.update(i.to_bytes(4, "little"))
            n += 1
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print(n, h.hexdigest())
    """
)


def test_encode_iterable_memory_bounded(tmp_path, cs336):
    """Stream a ~5 MB file with address space capped at +8 MB (in a subprocess: the limit is global)."""
    sample = (cs336 / "tinystories_sample.txt").read_text(encoding="utf-8")
    big = tmp_path / "tinystories_5M.txt"
    big.write_text(sample * (5_000_000 // len(sample) + 1), encoding="utf-8")
    env = {**os.environ, "JAXLM_DATA": str(cs336.parent)}

    def run(mode):
        return subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(big), mode], cwd=REPO, env=env,
                              capture_output=True, text=True)

    stream = run("stream")
    assert stream.returncode == 0, stream.stderr[-2000:]
    whole = run("whole")  # the same cap must be too small for encoding the text at once
    assert whole.returncode != 0 and "MemoryError" in whole.stderr
    tok = load_tokenizer("gpt2")
    import hashlib

    ids = tok.encode(big.read_text(encoding="utf-8"))
    h = hashlib.sha256(b"".join(i.to_bytes(4, "little") for i in ids)).hexdigest()
    assert stream.stdout.split() == [str(len(ids)), h]
