"""Tests for sedd.data: tokenizers, local TFDS builders, packing and batching."""

import io
import json
import math
import zipfile

import numpy as np
import pytest

from sedd import data
from sedd.data import builders, text


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _docs(builder, split):
    return list(data.read_documents(builder, split))


# ---------------------------------------------------------------- tokenizers


def test_char_tokenizer_round_trip_and_eos():
    tok = data.CharTokenizer.from_text(["hello world", "wold!\n"])
    assert tok.chars == "\n !dehlorw"
    assert tok.vocab_size == len(tok.chars) + 1 and tok.eos_id == len(tok.chars)
    ids = tok.encode("hello\nworld!")
    assert ids.dtype == np.int32 and ids.shape == (12,)
    assert tok.decode(ids) == "hello\nworld!"
    with_eos = np.concatenate([ids, [tok.eos_id]])
    assert tok.decode(with_eos) == "hello\nworld!" + data.EOS_TEXT
    assert tok.decode(with_eos, skip_eos=True) == "hello\nworld!"
    assert tok.decode([tok.vocab_size]) == "\ufffd"  # e.g. an absorbing mask id
    restored = data.tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    np.testing.assert_array_equal(restored.encode("world"), tok.encode("world"))


def test_char_tokenizer_unknown_character_fails_clearly():
    tok = data.CharTokenizer("abc ")
    with pytest.raises(ValueError) as err:
        tok.encode("a cab, zé")
    msg = str(err.value)
    for c in (",", "z", "é"):
        assert repr(c)[1:-1] in msg
    assert "' abc'" in msg  # the vocabulary is listed


def test_byte_tokenizer_round_trip_non_ascii(tmp_path):
    tok = data.get_tokenizer("byte")
    text = "naïve café — 東京 🙂"
    ids = tok.encode(text)
    assert tok.vocab_size == 257 and tok.eos_id == 256
    assert ids.dtype == np.int32 and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode(list(ids) + [256] + list(ids), skip_eos=True) == text + text
    assert tok.decode(ids[:-1]).endswith("\ufffd")  # a cut UTF-8 sequence
    data.save_tokenizer(tok, tmp_path / "tok.json")
    assert data.load_tokenizer(tmp_path / "tok.json").decode(ids) == text


def test_encode_many_equals_encode_of_each_text():
    texts = ["naïve", "", "café — 東京", "\n", "abc"]
    for tok in (data.CharTokenizer.from_text(texts), data.get_tokenizer("byte")):
        many = tok.encode_many(texts)
        assert len(many) == len(texts) and all(np.array_equal(m, tok.encode(t)) for m, t in zip(many, texts))
        assert all(m.dtype == np.int32 for m in many) and tok.encode_many([]) == []


def test_gpt2_tokenizer_without_files_says_what_to_provide(tmp_path):
    for path in (str(tmp_path / "nowhere"), ""):
        with pytest.raises(FileNotFoundError, match="vocab.json"):
            data.GPT2Tokenizer(path)
    with pytest.raises(FileNotFoundError, match="no tokenizer.json or vocab.json"):
        data.get_tokenizer("gpt2", path=str(tmp_path))
    with pytest.raises(ValueError, match="byte"):
        data.get_tokenizer("nope")


# ---------------------------------------------------------------- builders


def _check_splits(builder):
    train, val = _docs(builder, "train"), _docs(builder, "validation")
    assert train and val
    assert not set(train) & set(val)
    return train, val


def test_shakespeare_builder_on_fake_texts(tmp_path):
    texts = tmp_path / "texts"
    for i in range(5):
        _write(texts / f"play{i}_gut.txt", f"ACT I.\nPlay {i} speaks.\n" * 20)
    _write(texts / "play0_gut_f.txt", "the Folio copy is left out\n")
    builder = data.get_builder("shakespeare", str(texts), str(tmp_path / "tfds"))
    train, val = _check_splits(builder)
    assert len(train) == 5 and val[0].endswith("Play 4 speaks.")
    assert not any("Folio" in d for d in train + val)


def test_shakespeare_default_corpus(tmp_path):
    ds = data.load_dataset(
        {"name": "shakespeare", "path": "", "seq_len": 128, "tokenizer": "char", "data_dir": str(tmp_path)}
    )
    _check_splits(ds.builder)
    assert ds.num_tokens("train") > 1_000_000 and ds.num_tokens("validation") > 50_000
    assert 3.5 < ds.unigram_entropy_bits() < 5.5


def test_text_files_on_file_and_folder(tmp_path):
    one = _write(tmp_path / "one.txt", "".join(f"line {i}\n" for i in range(100)))
    b1 = data.get_builder("text", str(one), str(tmp_path / "tfds"))
    train, val = _check_splits(b1)
    assert "\n".join(train + val) == one.read_text().strip()  # cut at a line start
    folder = tmp_path / "corpus"
    for name in ("a.txt", "sub/b.txt", "sub/c.txt", "ignored.md"):
        _write(folder / name, f"document {name}\n" * 10)
    b2 = data.get_builder("text", str(folder), str(tmp_path / "tfds"))
    train, val = _check_splits(b2)
    assert len(train) == 3 and all("ignored" not in d for d in train + val)
    # Two corpora never share a cache directory.
    assert b1.data_dir != b2.data_dir


def test_the_preparing_line_says_how_a_file_is_read(tmp_path):
    """A Markdown file (a zero-shot eval's text, issue 71) is read as text, one document: the line said "one
    document per JSON line", which only a .jsonl file is."""
    notes = str(_write(tmp_path / "notes.md", "# Notes\n\nsome text\n"))
    rows = str(_write(tmp_path / "rows.jsonl", '{"text": "a"}\n'))
    tfds_dir = str(tmp_path / "tfds")
    assert (
        builders.TextFiles(notes, tfds_dir).describe()
        == "each file is one document; data.documents=lines or paragraphs splits them"
    )
    assert builders.TextFiles(notes, tfds_dir, "lines").describe() == "each line is a document"
    assert builders.TextFiles(rows, tfds_dir).describe() == "one document per JSON line"


def test_missing_path_and_unknown_name(tmp_path):
    missing = tmp_path / "no_such_corpus.txt"
    with pytest.raises(FileNotFoundError, match="no_such_corpus.txt"):
        data.get_builder("text", str(missing), str(tmp_path))
    with pytest.raises(FileNotFoundError, match="mattmahoney"):
        data.get_builder("text8", "", str(tmp_path))
    with pytest.raises(ValueError, match="tinystories"):
        data.load_dataset({"name": "wikipedia", "data_dir": str(tmp_path)})


def test_text8_from_tiny_zip(tmp_path):
    text = " ".join(["anarchism", "originated", "as", "a", "term"] * 200)[:2000]
    zpath = tmp_path / "text8.zip"
    with zipfile.ZipFile(zpath, "w") as z:
        z.writestr("text8", text)
    ds = data.load_dataset(
        {"name": "text8", "path": str(zpath), "tokenizer": "char", "seq_len": 16, "data_dir": str(tmp_path / "tfds")}
    )
    splits = {s: "".join(_docs(ds.builder, s)) for s in ("train", "validation", "test")}
    assert splits == {"train": text[:1800], "validation": text[1800:1900], "test": text[1900:]}
    # One continuous stream: no separator, one token per character.
    assert ds.num_tokens("train") == 1800 and ds.chars_per_token == 1.0
    assert ds.tokenizer.eos_id not in np.asarray(ds.tokens("train"))


def test_tinystories_train_valid_files_and_jsonl(tmp_path):
    folder = tmp_path / "ts"
    _write(folder / "TinyStories-train.txt", "Once a cat.\n<|endoftext|>\nOnce a dog.\n")
    _write(folder / "TinyStories-valid.txt", "Once a fox.\n")
    b = data.get_builder("tinystories", str(folder), str(tmp_path / "tfds"))
    assert _docs(b, "train") == ["Once a cat.", "Once a dog."]
    assert _docs(b, "validation") == ["Once a fox."]
    lines = [json.dumps({"text": f"web page {i}", "url": "x"}) for i in range(40)]
    jsonl = _write(tmp_path / "owt.jsonl", "\n".join(lines) + "\n")
    b = data.get_builder("openwebtext", str(jsonl), str(tmp_path / "tfds"))
    train, val = _check_splits(b)
    assert train + val == [f"web page {i}" for i in range(40)] and 1 <= len(val) <= 2


# ---------------------------------------------------------------- packing


def test_packing_separators_and_prefix():
    tok = data.CharTokenizer("abc")
    stream = data.tokenize_documents(["ab", "cab", "a"], tok)
    eos = tok.eos_id
    np.testing.assert_array_equal(stream, [0, 1, eos, 2, 0, 1, eos, 0, eos])
    packed = data.PackedTokens(stream, seq_len=4)
    seqs = packed.sequences(np.arange(packed.num_sequences))
    assert seqs.shape == (2, 4) and seqs.dtype == np.int32
    np.testing.assert_array_equal(seqs.reshape(-1), stream[:8])  # remainder dropped


def _packed(n_seq=37, seq_len=5):
    return data.PackedTokens(np.arange(n_seq * seq_len + seq_len - 1, dtype=np.uint16), seq_len)


def test_batches_are_resumable_and_cover_each_epoch():
    packed = _packed()
    fresh = packed.batches(batch_size=8, seed=3)
    first = [next(fresh) for _ in range(12)]
    resumed = _packed().batches(batch_size=8, seed=3, start_step=5)
    for k in range(5, 12):
        np.testing.assert_array_equal(next(resumed), first[k])
    # Each epoch visits every sequence once; another seed gives another order.
    order = np.concatenate([b[:, 0] // 5 for b in first])[:37]
    assert sorted(order) == list(range(37))
    other = next(_packed().batches(batch_size=8, seed=4))
    assert not np.array_equal(other, first[0])
    assert first[0].dtype == np.int32 and first[0].shape == (8, 5)


def test_process_slices_make_the_global_batch():
    packed = _packed()
    whole = packed.batches(16, seed=0, start_step=2)
    parts = [packed.batches(16, seed=0, start_step=2, process_index=p, process_count=2) for p in range(2)]
    for _ in range(4):
        local = [next(p) for p in parts]
        assert local[0].shape == (8, 5)
        np.testing.assert_array_equal(np.concatenate(local), next(whole))
    with pytest.raises(ValueError, match="divisible"):
        next(packed.batches(15, seed=0, process_count=2))


def test_eval_batches_in_order_with_wrap_around():
    packed = _packed(n_seq=10, seq_len=3)
    batches = list(packed.eval_batches(4))
    assert len(batches) == 3
    firsts = np.concatenate([b[:, 0] // 3 for b in batches])
    np.testing.assert_array_equal(firsts, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1])


def test_unigram_entropy_by_hand():
    tok = data.CharTokenizer("ab")
    h = data.unigram_entropy_bits(tok.encode("aaab"), tok.vocab_size)
    assert h == pytest.approx(-(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)))
    assert data.unigram_entropy_bits(np.zeros(5, np.int32)) == 0.0


def test_load_dataset_caches_tokens(tmp_path, monkeypatch):
    corpus = _write(tmp_path / "c.txt", "to be or not to be\n" * 60)
    cfg = {"name": "text", "path": str(corpus), "tokenizer": "char", "seq_len": 16, "data_dir": str(tmp_path / "tfds")}
    ds = data.load_dataset(cfg)
    # Each split is one document: its final "\n" is stripped, an EOS appended.
    assert ds.num_tokens("train") + ds.num_tokens("validation") == 60 * 19
    assert 0.99 < ds.chars_per_token < 1.0
    batch = next(ds.train_batches(4, seed=1))
    assert batch.shape == (4, 16) and batch.dtype == np.int32
    assert ds.tokenizer.decode(batch[0]) in ds.tokenizer.decode(ds.tokens("train"))
    monkeypatch.setattr(data, "tokenize_documents", lambda *a, **k: 1 / 0)
    again = data.load_dataset(cfg, tokenizer=data.tokenizer_from_dict(ds.tokenizer.to_dict()))
    np.testing.assert_array_equal(next(again.train_batches(4, seed=1)), batch)
    assert again.unigram_entropy_bits() == pytest.approx(ds.unigram_entropy_bits())


class _WideTokenizer:
    """Ids above 65535, so the cache must be int32."""

    name, vocab_size, eos_id = "wide", 70_000, 69_999

    def encode(self, s):
        return np.array([65_536 + ord(c) % 100 for c in s], np.int32)


def test_token_cache_is_written_as_the_documents_arrive(tmp_path, monkeypatch):
    monkeypatch.setattr(data.records, "RECORD_BYTES", 1000)  # documents are encoded in batches of this size
    tok = data.get_tokenizer("byte")
    docs = ["x" * 20_000, "yé" * 5_000, "", "z" * 30_000]
    on_disk = []

    def documents():  # records the bytes already written when each document is asked for
        for doc in docs:
            tmp = list(tmp_path.glob("*.tmp.npy"))
            on_disk.append(tmp[0].stat().st_size if tmp else 0)
            yield doc, True

    stats = text.write_token_cache(tmp_path / "train.npy", documents(), tok)
    expect = data.tokenize_documents(docs, tok)
    got = np.load(tmp_path / "train.npy", mmap_mode="r")
    assert got.dtype == np.uint16 and np.array_equal(got, expect)
    assert stats == {"documents": 4, "chars": sum(map(len, docs)), "tokens": len(expect)}
    # The tokens of documents 0..k-1 are on disk (up to one write buffer) before document k is read.
    before = np.cumsum([0] + [len(data.tokenize_documents([d], tok)) for d in docs[:-1]])
    assert all(size >= 2 * n - io.DEFAULT_BUFFER_SIZE for size, n in zip(on_disk, before))
    assert on_disk[-1] > 2 * 35_000 and not list(tmp_path.glob("*.tmp.npy"))

    text.write_token_cache(tmp_path / "wide.npy", iter([("ab", True), ("c", True)]), _WideTokenizer())
    wide = np.load(tmp_path / "wide.npy")
    assert wide.dtype == np.int32 and wide.tolist() == [65_633, 65_634, 69_999, 65_635, 69_999]
    text.write_token_cache(tmp_path / "empty.npy", iter([]), tok)
    assert np.load(tmp_path / "empty.npy").shape == (0,)
