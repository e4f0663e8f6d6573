"""Preparing local corpora: streaming in bounded memory, faults in the files, documents per line."""

import json
import tracemalloc

import numpy as np
import pytest

from sedd import data
from sedd.data import builders, records


def _write(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def _docs(builder, split):
    return list(data.read_documents(builder, split))


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks, records and shards a few KiB long, so a small file behaves as a large one does."""
    monkeypatch.setattr(records, "BLOCK", 1000)
    monkeypatch.setattr(records, "RECORD_BYTES", 1500)
    monkeypatch.setattr(builders, "SHARD_BYTES", 8000)


# ---------------------------------------------------------------- streaming


def test_preparation_reads_in_blocks_and_writes_small_shards(tmp_path, small_blocks, monkeypatch):
    lines = [f"line {i} " + "é" * (i % 7) + "x" * (i % 50) for i in range(2000)]
    lines[500] = "ü" * 2999  # one line longer than a block: cut at character boundaries
    corpus = _write(tmp_path / "big.txt", "\n".join(lines) + "\n")
    reads = []

    class Recording:
        def __init__(self, f):
            self.f, self.name = f, f.name

        def read(self, n=-1):
            out = self.f.read(n)
            reads.append(len(out))
            return out

        def __getattr__(self, k):
            return getattr(self.f, k)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(builders, "open", lambda *a, **k: Recording(open(*a, **k)), raising=False)
    b = data.get_builder("text", str(corpus), str(tmp_path / "tfds"))
    assert reads and max(reads) <= records.BLOCK + 4  # +4: the look-ahead of the split's cut
    assert sum(reads) < 1.1 * corpus.stat().st_size  # the file is read about once
    # Many shards of about SHARD_BYTES, records of about RECORD_BYTES: TFDS never held the corpus.
    shards = sorted(b.data_path.glob("*train.array_record-*"))
    assert len(shards) >= corpus.stat().st_size * 0.9 // builders.SHARD_BYTES
    source = b.as_data_source("train")
    sizes = [len(source[i]["text"]) for i in range(len(source))]
    assert max(sizes) <= records.RECORD_BYTES + 2 * records.BLOCK  # a chunk: a block and the line it ends
    # The text is the file's: one document, split at a line start into train and validation.
    train, val = _docs(b, "train"), _docs(b, "validation")
    assert len(train) == len(val) == 1
    assert train[0] + "\n" + val[0] == corpus.read_text().strip()


def test_memory_does_not_grow_with_the_corpus(tmp_path, monkeypatch):
    # Python's peak while preparing and tokenizing 4 MB with 4 kB blocks and 64 kB shards: a small part of
    # the corpus (what grows is a few hundred bytes of TFDS bookkeeping per shard).
    monkeypatch.setattr(records, "BLOCK", 4096)
    monkeypatch.setattr(records, "RECORD_BYTES", 4096)
    monkeypatch.setattr(builders, "SHARD_BYTES", 1 << 16)
    cfg = {"tokenizer": "byte", "seq_len": 64, "data_dir": str(tmp_path / "tfds")}
    data.load_dataset({"name": "text", "path": str(_write(tmp_path / "warm.txt", "warm up\n" * 500)), **cfg})
    text = "".join(f"{i} the quick brown fox jumps over the lazy dog\n" for i in range(80_000))
    corpus = _write(tmp_path / "c.txt", text)
    tracemalloc.start()
    try:
        ds = data.load_dataset({"name": "text", "path": str(corpus), **cfg})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ds.num_tokens("train") + ds.num_tokens("validation") == len(text)  # 2 final newlines stripped, 2 EOS
    assert peak < corpus.stat().st_size / 10, peak


def test_a_document_longer_than_a_record_comes_back_whole(tmp_path, small_blocks):
    one_line = "ab é " * 2000  # 10 kB without a newline
    corpus = _write(tmp_path / "c-train.txt", "  \n" + one_line + "\n\n  ")
    _write(tmp_path / "c-valid.txt", "v")
    b = data.get_builder("text", str(tmp_path), str(tmp_path / "tfds"))
    assert _docs(b, "train") == [one_line.strip()] and _docs(b, "validation") == ["v"]
    pieces = list(data.read_pieces(b, "train"))
    assert len(pieces) > 3 and [e for _, e in pieces] == [False] * (len(pieces) - 1) + [True]
    ds = data.load_dataset(
        {"name": "text", "path": str(tmp_path), "tokenizer": "char", "seq_len": 8, "data_dir": str(tmp_path / "tfds")}
    )
    tok = ds.tokenizer
    np.testing.assert_array_equal(ds.tokens("train"), np.append(tok.encode(one_line.strip()), tok.eos_id))
    assert ds.stats["train"]["documents"] == 1 and corpus.exists()


# ---------------------------------------------------------------- documents per file, line or paragraph


def test_documents_per_file_line_or_paragraph(tmp_path):
    _write(tmp_path / "c" / "c-train.txt", "one\ntwo  \n\n  three\nfour\n\n\n")
    _write(tmp_path / "c" / "c-valid.txt", "five\nsix\n")
    expect = {
        "file": ["one\ntwo  \n\n  three\nfour", "five\nsix"],
        "lines": ["one", "two", "three", "four", "five", "six"],
        "paragraphs": ["one\ntwo", "three\nfour", "five\nsix"],
    }
    for mode, docs in expect.items():
        b = data.get_builder("text", str(tmp_path / "c"), str(tmp_path / "tfds"), documents=mode)
        assert _docs(b, "train") + _docs(b, "validation") == docs, mode
    ds = data.load_dataset(
        {
            "name": "text",
            "path": str(tmp_path / "c"),
            "documents": "lines",
            "tokenizer": "char",
            "seq_len": 4,
            "data_dir": str(tmp_path / "tfds"),
        }
    )
    assert ds.stats["train"] == {"documents": 4, "chars": 15, "tokens": 19}  # one EOS after each line
    with pytest.raises(ValueError, match="data.documents must be one of"):
        data.get_builder("text", str(tmp_path / "c"), str(tmp_path / "tfds"), documents="sentences")


def test_the_default_config_names_the_documents_option():
    from sedd.configs import shakespeare_char

    assert shakespeare_char.get_config().data.documents == "file"


# ---------------------------------------------------------------- faults


def test_invalid_utf8_is_replaced_with_a_warning_naming_file_count_and_offset(tmp_path):
    bad = b"good line\nabc\xff\xfedef \xef\xbf\xbd kept\n" + b"more text\n" * 20
    corpus = _write(tmp_path / "bad.txt", bad)
    with pytest.warns(
        UserWarning,
        match=r"bad\.txt: 2 invalid UTF-8 sequence\(s\) replaced by U\+FFFD, "
        r"the first at byte offset 13",
    ):
        b = data.get_builder("text", str(corpus), str(tmp_path / "tfds"))
    train = _docs(b, "train")[0]
    assert "abc\ufffd\ufffddef \ufffd kept" in train
    jsonl = _write(tmp_path / "j.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n' * 40)
    with pytest.warns(UserWarning, match=r"j\.jsonl: \d+ invalid UTF-8"):
        b = data.get_builder("text", str(jsonl), str(tmp_path / "tfds"))
    assert "caf\ufffd" in _docs(b, "train")


def test_a_broken_json_line_is_named(tmp_path):
    jsonl = _write(tmp_path / "j.jsonl", '{"text": "a"}\n{"txt": "b"}\n' + '{"text": "c"}\n' * 10)
    with pytest.raises(ValueError, match=r"j\.jsonl, the line at byte offset 14: not a JSON object with a \"text\""):
        data.get_builder("text", str(jsonl), str(tmp_path / "tfds"))


def test_empty_files_are_skipped_with_a_warning_and_all_empty_is_an_error(tmp_path):
    folder = tmp_path / "c"
    _write(folder / "a.txt", "some text\n" * 30)
    _write(folder / "empty.txt", "")
    _write(folder / "sub" / "also_empty.txt", "")
    with pytest.warns(UserWarning, match="skipping 2 empty file"):
        b = data.get_builder("text", str(folder), str(tmp_path / "tfds"))
    assert len(_docs(b, "train")) == 1
    (folder / "a.txt").write_text("")
    with pytest.raises(ValueError, match="all its files are empty"):
        data.get_builder("text", str(folder), str(tmp_path / "tfds"))
    with pytest.raises(ValueError, match="it is empty"):
        data.get_builder("text", str(folder / "empty.txt"), str(tmp_path / "tfds"))
    blank = _write(tmp_path / "blank.txt", " \n\n\t\n" * 10)
    with pytest.raises(ValueError, match="split of .*blank.txt is empty: no document"):
        data.get_builder("text", str(blank), str(tmp_path / "tfds"))


def test_a_corpus_file_gone_after_preparation(tmp_path, capsys):
    one = _write(tmp_path / "one.txt", "to be or not to be\n" * 40)
    cfg = {"name": "text", "path": str(one), "tokenizer": "char", "seq_len": 16, "data_dir": str(tmp_path / "tfds")}
    ds = data.load_dataset(cfg)
    one.unlink()
    # The path is gone: its prepared data is used, with a warning that says so.
    with pytest.warns(UserWarning, match=r"one\.txt is gone: using the data prepared from it on .* \(1 file"):
        again = data.load_dataset(cfg, tokenizer=ds.tokenizer)
    np.testing.assert_array_equal(again.tokens("train"), ds.tokens("train"))
    # One file of a folder gone: the corpus changed, so it is prepared again, and the line says what went.
    folder = tmp_path / "c"
    for name in ("a.txt", "b.txt", "c.txt"):
        _write(folder / name, f"document {name}\n" * 10)
    b1 = data.get_builder("text", str(folder), str(tmp_path / "tfds"))
    (folder / "b.txt").unlink()
    capsys.readouterr()
    b2 = data.get_builder("text", str(folder), str(tmp_path / "tfds"))
    assert "changed since it was prepared (gone: b.txt)" in capsys.readouterr().out
    assert b2.data_dir != b1.data_dir
    assert not any("b.txt" in d for d in _docs(b2, "train") + _docs(b2, "validation"))
    # Never prepared and missing: an error naming the path.
    with pytest.raises(FileNotFoundError, match="no_such.txt"):
        data.get_builder("text", str(tmp_path / "no_such.txt"), str(tmp_path / "tfds"))


def test_a_file_cut_short_while_it_is_prepared_is_named(tmp_path):
    f = _write(tmp_path / "short.txt", "abc\n")
    with pytest.raises(RuntimeError, match=r"short\.txt ends at byte 4, not 100 .* changed while being prepared"):
        list(records.text_fragments(records.Segment(f, 0, 100)))


def test_split_plan_of_several_files(tmp_path):
    files = [_write(tmp_path / f"{k}.txt", "x" * 99 + "\n") for k in "abc"]
    plan = builders.plan_splits(files, val_fraction=0.5)
    assert [(s.path.name, s.start, s.end) for s in plan["train"]] == [("a.txt", 0, 100), ("b.txt", 0, 50)]
    assert [(s.path.name, s.start, s.end) for s in plan["validation"]] == [("b.txt", 50, 100), ("c.txt", 0, 100)]
    js = _write(tmp_path / "d.jsonl", "".join(json.dumps({"text": "y" * 40}) + "\n" for _ in range(4)))
    plan = builders.plan_splits([js], val_fraction=0.6)  # the cut falls inside line 2: it stays in train
    assert plan["train"][0].end == 2 * 53 and plan["validation"][0].start == 2 * 53
