"""prepare -> meta/tokenizer -> loader batches; bad input; download failure; the CLI."""

import json
import os
import subprocess
import sys
import threading
from functools import partial
from http.server import HTTPServer, SimpleHTTPRequestHandler

import numpy as np
import pytest

from jaxlm.core.config import DataConfig
from jaxlm.data import corpora
from jaxlm.data import prepare as prepare_module
from jaxlm.data.bpe import DataError, save_vocab_merges, train_bpe
from jaxlm.data.loader import eval_batches, get_batch, step_offsets, train_batches
from jaxlm.data.prepare import (
    ensure_prepared,
    load_tokenizer_from_meta,
    prepare,
    read_meta,
    tokens,
)

EOT = "<|endoftext|>"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def docs(cs336, tinyshakespeare, tmp_path_factory):
    d = tmp_path_factory.mktemp("docs")
    a = d / "a.txt"
    a.write_text((tinyshakespeare / "input.txt").read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    b = d / "b.txt"
    b.write_text((cs336 / "tinystories_sample.txt").read_text(encoding="utf-8"), encoding="utf-8")
    return [a, b]


@pytest.fixture(scope="session")
def prepared(docs, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    prepare([str(p) for p in docs], "gpt2", out, val_fraction=0.1, progress=False)
    return out


def _expected(tok, paths):
    ids = []
    for p in paths:
        text = p.read_text(encoding="utf-8")
        ids += tok.encode(text) + ([] if text.endswith(EOT) else [tok.eot_id])
    return np.array(ids)


def test_prepare_tokens_and_meta(prepared, docs):
    meta = read_meta(prepared)
    tok = load_tokenizer_from_meta(prepared)
    expected = _expected(tok, docs)
    train, val = tokens(prepared, "train"), tokens(prepared, "val")
    assert train.dtype == np.uint16 and meta["dtype"] == "uint16"
    assert np.array_equal(np.concatenate([train, val]), expected)
    assert meta["tokens"] == {"train": len(train), "val": len(val)}
    assert len(val) == round(0.1 * len(expected))
    assert meta["vocab_size"] == 50257 and meta["eot_id"] == 50256 and meta["tokenizer"] == "gpt2"
    assert [s["bytes"] for s in meta["sources"]["train"]] == [p.stat().st_size for p in docs]
    assert not list(prepared.glob("*.tmp"))


def test_parallel_prepare_equals_serial(docs, tmp_path, monkeypatch, prepared):
    monkeypatch.setattr(prepare_module, "_PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(prepare_module, "_CHUNK_BYTES", 4096)
    prepare([str(p) for p in docs], "gpt2", tmp_path, workers=2, progress=False)
    for split in ("train", "val"):
        assert np.array_equal(tokens(tmp_path, split), tokens(prepared, split))


def test_trained_tokenizer_dir_is_copied(tmp_path, docs, cs336):
    vocab, merges = train_bpe(cs336 / "corpus.en", 400, [EOT])
    tokdir = tmp_path / "tok"
    save_vocab_merges(tokdir, vocab, merges)
    out = tmp_path / "data"
    meta = prepare([str(docs[1])], str(tokdir), out, val_inputs=[str(docs[0])], progress=False)
    for name in ("vocab.json", "merges.txt", "special_tokens.json"):
        (tokdir / name).unlink(missing_ok=True)  # the data dir must not need the original
    tok = load_tokenizer_from_meta(out)
    assert tok.vocab_size == 400 and meta["eot_id"] == 0
    assert np.array_equal(tokens(out, "val"), _expected(tok, [docs[0]]))
    assert np.array_equal(tokens(out, "train"), _expected(tok, [docs[1]]))


def test_bpe_trained_while_preparing_equals_train_bpe(tmp_path, docs, cs336):
    """data.tokenizer = "bpe:N": the BPE `train_bpe` gives on the training text, kept in the data directory,
    with a separate validation source (data.val_source)."""
    cfg = DataConfig(dir=str(tmp_path / "d"), source=[str(docs[1])], val_source=[str(docs[0])], tokenizer="bpe:300")
    meta = read_meta(ensure_prepared(cfg, progress=False))
    vocab, merges = train_bpe(docs[1], 300, [EOT])
    tok = load_tokenizer_from_meta(tmp_path / "d")
    assert tok.vocab == vocab and tok.merges == merges
    assert meta["tokenizer"] == "bpe:300" and meta["bpe_train_seconds"] >= 0
    assert np.array_equal(tokens(tmp_path / "d", "train"), _expected(tok, [docs[1]]))
    assert np.array_equal(tokens(tmp_path / "d", "val"), _expected(tok, [docs[0]]))
    assert meta["sources"]["val"][0]["path"] == str(docs[0]) and not (tmp_path / "d" / "bpe").exists()
    assert ensure_prepared(cfg) == tmp_path / "d"  # prepared once: the same spec is the same tokenizer
    with pytest.raises(DataError, match="'bpe:300' but data.tokenizer is 'bpe:400'"):
        ensure_prepared(DataConfig(dir=cfg.dir, source=cfg.source, tokenizer="bpe:400"))
    with pytest.raises(DataError, match=r"tokenizer 'bpe:12': expected bpe:N with N > 257"):
        prepare([str(docs[1])], "bpe:12", tmp_path / "x", progress=False)


def test_pydoc_source(tmp_path):
    meta = prepare(["pydoc"], "bytes", tmp_path, progress=False)
    assert meta["vocab_size"] == 257 and meta["tokens"]["train"] > 300_000
    from pydoc_data.topics import topics

    first = topics[sorted(topics)[0]].encode()
    assert bytes(tokens(tmp_path, "train")[: len(first)].astype(np.uint8)) == first


def test_ensure_prepared(tmp_path, docs):
    cfg = DataConfig(dir=str(tmp_path / "d"), source=[str(docs[1])], tokenizer="bytes", val_fraction=0.2)
    d = ensure_prepared(cfg, progress=False)
    mtime = (d / "meta.json").stat().st_mtime_ns
    assert ensure_prepared(cfg) == d and (d / "meta.json").stat().st_mtime_ns == mtime
    with pytest.raises(DataError, match="'bytes'.*'gpt2'"):
        ensure_prepared(DataConfig(dir=cfg.dir, source=cfg.source, tokenizer="gpt2"))


def test_bad_input_names_the_file(tmp_path, docs):
    out = tmp_path / "out"
    with pytest.raises(DataError, match="missing.txt: file not found"):
        prepare([str(tmp_path / "missing.txt")], "bytes", out)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9 ".encode("latin-1") * 10)
    with pytest.raises(DataError, match="latin1.txt: not valid UTF-8 at byte 3"):
        prepare([str(bad)], "bytes", out, progress=False)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="empty.txt: empty corpus"):
        prepare([str(empty)], "bytes", out, progress=False)
    with pytest.raises(DataError, match="does not fit in uint16"):
        big = tmp_path / "bigtok"
        vocab, merges = train_bpe(docs[1], 300, [EOT])
        vocab[70_000] = b"stray"
        save_vocab_merges(big, vocab, merges)
        prepare([str(docs[1])], str(big), out, dtype="uint16", progress=False)
    assert prepare([str(docs[1])], str(big), out, progress=False)["dtype"] == "uint32"  # auto widens
    (out / "meta.json").unlink()
    assert not (out / "meta.json").exists()


def test_cli_prepare(tmp_path, docs):
    run = partial(subprocess.run, cwd=REPO, capture_output=True, text=True)
    ok = run([sys.executable, "-m", "jaxlm.data", "prepare", "--input", str(docs[1]), "--tokenizer", "bytes",
              "--out", str(tmp_path / "o"), "--workers", "1"])
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "o" / "meta.json").read_text())["tokenizer"] == "bytes"
    bad = run([sys.executable, "-m", "jaxlm.data", "prepare", "--input", str(tmp_path / "nope.txt"),
               "--out", str(tmp_path / "o2")])
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"error: {tmp_path / 'nope.txt'}: file not found"]


# --------------------------------------------------------------------------- loader


def test_train_batches_are_source_windows(prepared):
    train = np.asarray(tokens(prepared, "train"))
    m, b = 64, 8
    it = train_batches(prepared, b, m, seed=3)
    for step in range(4):
        x, y = next(it)
        assert x.shape == y.shape == (b, m) and x.dtype == np.int32
        offsets = step_offsets(3, step, len(train) - m, b)
        assert offsets.max() <= len(train) - m - 1
        assert np.array_equal(x, np.stack([train[i : i + m] for i in offsets]))
        assert np.array_equal(y, np.stack([train[i + 1 : i + m + 1] for i in offsets]))
    assert it.step == 4  # enough to resume: train_batches(..., start_step=it.step)
    it.close()


def test_resume_and_sharding(prepared):
    m, b = 32, 8
    full = train_batches(prepared, b, m, seed=7)
    ref = [next(full) for _ in range(6)]
    full.close()
    resumed = train_batches(prepared, b, m, seed=7, start_step=4)
    for step in (4, 5):
        x, y = next(resumed)
        assert np.array_equal(x, ref[step][0]) and np.array_equal(y, ref[step][1])
    resumed.close()
    parts = [train_batches(prepared, b, m, seed=7, start_step=2, process_index=p, process_count=2) for p in range(2)]
    for step in (2, 3):
        rows = [next(p) for p in parts]
        assert rows[0][0].shape == (b // 2, m)
        assert np.array_equal(np.concatenate([r[0] for r in rows]), ref[step][0])
    for p in parts:
        p.close()
    other = train_batches(prepared, b, m, seed=8)
    assert not np.array_equal(next(other)[0], ref[0][0])
    other.close()


def test_worker_processes_give_the_same_batches(prepared):
    ref = train_batches(prepared, 4, 16, seed=1)
    mp_it = train_batches(prepared, 4, 16, seed=1, num_workers=1)
    for _ in range(3):
        assert np.array_equal(next(mp_it)[0], next(ref)[0])
    mp_it.close()
    ref.close()


def _scored(prepared, batch, context, eval_tokens, **kw):
    """The (position of the target in val.bin, target) pairs the batches score, in order."""
    out = []
    for k, (x, y, mask) in enumerate(eval_batches(prepared, "val", batch, context, eval_tokens, **kw)):
        assert x.shape == y.shape == mask.shape == (batch // kw.get("process_count", 1), context)
        for r, c in zip(*np.nonzero(mask)):
            out.append((int(y[r, c]), int(x[r, c])))
    return out


def test_eval_batches_score_the_same_targets_at_every_batch_and_context(prepared):
    val = np.asarray(tokens(prepared, "val"))
    n = 1000  # not a multiple of any context below: the last window is cut at target n
    expected = [(int(val[t]), int(val[t - 1])) for t in range(1, n + 1)]
    for batch, context in [(1, 50), (4, 50), (7, 64), (32, 13)]:
        assert _scored(prepared, batch, context, n) == expected, (batch, context)
    assert len(_scored(prepared, 4, 50, 0)) == len(val) - 1  # 0: the whole split
    assert len(_scored(prepared, 4, 50, 10**9)) == len(val) - 1


def test_eval_batches_rows_of_several_processes_make_the_global_batch(prepared):
    full = list(eval_batches(prepared, "val", 4, 50, 1000))
    halves = [list(eval_batches(prepared, "val", 4, 50, 1000, process_index=p, process_count=2)) for p in (0, 1)]
    for whole, a, b in zip(full, *halves):
        for i in range(3):
            assert np.array_equal(whole[i], np.concatenate([a[i], b[i]]))


def test_get_batch_numpy():
    x = np.arange(100)
    inp, tgt = get_batch(x, 16, 10, np.random.default_rng(0))
    assert inp.shape == (16, 10) and inp.dtype == np.int64
    assert np.array_equal(tgt, inp + 1) and inp.min() >= 0 and inp[:, 0].max() <= 89
    starts = np.concatenate([get_batch(x, 64, 10, s)[0][:, 0] for s in range(50)])
    assert set(starts.tolist()) == set(range(90))  # every offset 0 .. len-m-1 is reachable


# --------------------------------------------------------------------------- download


def _corpus(monkeypatch, name, *remotes, files=None):
    """Swap corpus `name` in the registry for one served by `remotes`."""
    files = files or tuple(r.name.removesuffix(".gz") for r in remotes)
    monkeypatch.setitem(corpora.CORPORA, name, corpora.Corpus(name, "test", files[:1], files, remotes))


def test_download_failure_names_url(tmp_path, monkeypatch):
    url = "http://127.0.0.1:9/TinyStoriesV2-GPT4-train.txt"  # discard port: refused at once
    _corpus(monkeypatch, "tinystories", corpora.Remote(url, "train.txt"))
    offline = "JAXLM_DATA at a folder that holds tinystories/; the README's quickstart needs no download"
    with pytest.raises(DataError, match=f"cannot download {url}.*curl -L -o .*{offline}"):
        corpora.download("tinystories", tmp_path, timeout=2, progress=False)
    assert not (tmp_path / "tinystories" / "train.txt").exists()


@pytest.fixture
def server(tmp_path):
    """A local HTTP server over tmp_path/served; yields (folder, base URL)."""
    served = tmp_path / "served"
    served.mkdir()
    httpd = HTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(served)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


def test_download_checks_digest_and_unpacks(tmp_path, monkeypatch, server):
    import gzip
    import hashlib

    served, base = server
    archive = gzip.compress(b"hello world\n" * 1000)
    (served / "x.txt.gz").write_bytes(archive)
    _corpus(monkeypatch, "openwebtext", corpora.Remote(f"{base}/x.txt.gz", "x.txt.gz", len(archive),
                                                       hashlib.sha256(archive).hexdigest(), unpack="gunzip"))
    files = corpora.download("openwebtext", tmp_path / "root", progress=False)
    assert files == [tmp_path / "root" / "openwebtext" / "x.txt"] and files[0].read_bytes() == b"hello world\n" * 1000
    assert [p.name for p in (tmp_path / "root" / "openwebtext").iterdir()] == ["x.txt"]  # no archive, no .part
    monkeypatch.setenv("JAXLM_DATA", str(tmp_path / "root"))
    assert corpora.resolve_sources(["openwebtext", "pydoc", "a.txt"]) == [str(files[0]), "pydoc", "a.txt"]


def test_download_with_wrong_digest_keeps_nothing(tmp_path, monkeypatch, server):
    served, base = server
    (served / "t.txt").write_bytes(b"tampered")
    _corpus(monkeypatch, "tinyshakespeare", corpora.Remote(f"{base}/t.txt", "t.txt", 8, "0" * 64))
    with pytest.raises(DataError, match=r"/t\.txt: sha256 [0-9a-f]{64}, expected 0{64}"):
        corpora.download("tinyshakespeare", tmp_path, progress=False)
    assert list((tmp_path / "tinyshakespeare").iterdir()) == []


def test_corpus_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXLM_DATA", str(tmp_path / "root"))
    cfg = DataConfig(dir=str(tmp_path / "tok"), source=["tinyshakespeare"], tokenizer="bytes")
    with pytest.raises(DataError, match=r"tinyshakespeare/input\.txt: corpus 'tinyshakespeare' not found; "
                                         r"run `python -m jaxlm\.data download tinyshakespeare`"):
        ensure_prepared(cfg, progress=False)
    (tmp_path / "root" / "tinyshakespeare").mkdir(parents=True)
    (tmp_path / "root" / "tinyshakespeare" / "input.txt").write_text("To be, or not to be\n" * 50)
    meta = read_meta(ensure_prepared(cfg, progress=False))
    assert meta["sources"]["train"][0]["path"] == str(tmp_path / "root" / "tinyshakespeare" / "input.txt")
    assert meta["tokens"]["train"] + meta["tokens"]["val"] == 20 * 50 + 1  # bytes + <|endoftext|>
    unknown = r"^tinyshakspeare: file not found and no corpus of that name \(corpora: tinyshakespeare, "
    with pytest.raises(DataError, match=unknown):
        prepare(["tinyshakspeare"], "bytes", tmp_path / "x", progress=False)
    # one file of a corpus by NAME/FILE, from the data root
    (tmp_path / "root" / "wikitext-2").mkdir()
    (tmp_path / "root" / "wikitext-2" / "test.txt").write_text(" = Valkyria = \n" * 10)
    assert corpora.resolve_sources(["wikitext-2/test.txt"]) == [str(tmp_path / "root" / "wikitext-2" / "test.txt")]
    missing = r"wikitext-2/valid\.txt: corpus 'wikitext-2' not found; run `python -m jaxlm\.data download"
    with pytest.raises(DataError, match=missing):
        corpora.resolve_sources(["wikitext-2/valid.txt"])


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
