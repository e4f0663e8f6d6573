"""The zero-shot test sets of Table 1 from local files: detokenizers, readers, the original's cut into sequences."""

import json

import numpy as np
import pytest

from sedd import data
from sedd.data import zeroshot


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _load(tmp_path, name, path, seq_len=4):
    return data.load_dataset(
        {"name": name, "path": str(path), "tokenizer": "byte", "seq_len": seq_len, "data_dir": str(tmp_path / "tfds")},
        tokenizer=data.get_tokenizer("byte"),
    )


def _stream(rows, seq_len=None, groups=None):
    """The byte stream of rows, EOS after each; cut per group of rows as the original does."""
    groups = groups or [len(rows)]
    out, start = [], 0
    for n in groups:
        ids = data.tokenize_documents(rows[start : start + n], data.get_tokenizer("byte"))
        out.append(ids[: len(ids) // seq_len * seq_len] if seq_len else ids)
        start += n
    return np.concatenate(out)


def test_detokenizers_on_examples_of_each_set():
    assert zeroshot.wt_detokenizer(" = = Career = = \n") == " == Career ==\n"
    assert (
        zeroshot.wt_detokenizer(' It cost 1 @,@ 000 @.@ 5 dollars ( in 1999 ) , a " record " . \n')
        == ' It cost 1,000.5 dollars (in 1999), a "record".\n'
    )
    assert zeroshot.wt_detokenizer("the well @-@ known player 's N ") == "the well-known player's 1 "
    assert (
        zeroshot.ptb_detokenizer("he does n't own N N shares of <unk> 's $ N stock")
        == "he doesn't own 1 1 shares of ?'s $1 stock"
    )
    assert zeroshot.ptb_detokenizer("a\\/b") == "a/b"
    assert (
        zeroshot.lm1b_detokenizer("See http : / / x.com , he said ' hi ' ( ok ) ?")
        == "See http://x.com, he said 'hi' (ok)?"
    )
    assert zeroshot.lm1b_detokenizer("It costs $ 5 and £ 3 .") == "It costs $5 and £3."
    assert zeroshot.lambada_detokenizer("  \u201cYes,\u201d she said  ") == '\n"Yes," she said'


def test_original_row_groups():
    assert zeroshot.row_groups(4358) == [545] * 6 + [544] * 2  # WikiText-2/103 test: 8 shards under 1,000 rows
    groups = zeroshot.row_groups(306_688)  # One Billion Words test
    assert sum(groups) == 306_688 and groups[:39] == [1000] * 38 + [336] and len(groups) == 8 * 39
    assert zeroshot.row_groups(5) == [1] * 5 and zeroshot.row_groups(0) == []


def test_wikitext_rows_blank_lines_and_sequences(tmp_path, monkeypatch):
    rows = [
        " \n",
        " = Valkyria = \n",
        " \n",
        " The game @-@ play , as in ( 2011 ) . \n",
        "\n",
        " = = Plot = = \n",
        " It is N km . \n",
    ] * 3
    raw = _write(tmp_path / "wikitext-2-raw" / "wiki.test.raw", "".join(rows))
    monkeypatch.setattr(zeroshot, "HF_MAP_BATCH", 2)  # groups of 2 rows: the cut per group shows
    ds = _load(tmp_path, "wikitext2", raw)
    assert ds.splits == ["test"]
    # Each line is a row, blank ones empty (one EOS each), detokenized; each group of rows cut to a multiple of L.
    expect_rows = [zeroshot.wt_detokenizer(r if r.strip() else "") for r in rows]
    assert list(data.read_documents(ds.builder, "test")) == expect_rows
    groups = zeroshot.row_groups(len(rows))
    assert groups == [2, 1] * 5 + [2] * 3  # 21 rows: 8 shards of 3 or 2 rows, in batches of at most 2
    np.testing.assert_array_equal(ds.tokens("test"), _stream(expect_rows, 4, groups))
    assert len(ds.tokens("test")) % 4 == 0 and ds.chars_per_token > 0
    assert next(ds.eval_batches(2, split="test")).shape == (2, 4)  # what `sedd eval --split test` reads
    # A folder gives a split per file it holds.
    _write(tmp_path / "wikitext-2-raw" / "wiki.valid.raw", " = Other = \n text \n")
    b = data.get_builder("wikitext2", str(tmp_path / "wikitext-2-raw"), str(tmp_path / "tfds"))
    assert sorted(b.info.splits.keys()) == ["test", "validation"]


def test_ptb_lm1b_and_lambada_readers(tmp_path):
    ptb = _write(tmp_path / "ptb.test.txt", " no it was n't black monday \n the <unk> fell N % \n")
    ds = _load(tmp_path, "ptb", ptb, seq_len=1)
    docs = ["no it wasn't black monday", "the ? fell 1 %"]
    assert list(data.read_documents(ds.builder, "test")) == docs
    np.testing.assert_array_equal(ds.tokens("test"), _stream(docs))

    heldout = tmp_path / "heldout-monolingual.tokenized.shuffled"
    _write(heldout / "news.en.heldout-00001-of-00050", "Second file , first line .\n")
    _write(heldout / "news.en.heldout-00000-of-00050", 'He said : " yes " .\nIt \'s $ 5 .\n')
    b = data.get_builder("lm1b", str(heldout), str(tmp_path / "tfds"))
    assert list(data.read_documents(b, "test")) == ['He said: "yes" .', "It's $5.", "Second file, first line."]

    lines = [{"text": "\u201cHi,\u201d said the cat"}, {"text": "  The end of the story  "}]
    lam = _write(tmp_path / "lambada_test.jsonl", "".join(json.dumps(r) + "\n" for r in lines) + "\n")
    b = data.get_builder("lambada", str(lam), str(tmp_path / "tfds"))
    assert list(data.read_documents(b, "test")) == ['\n"Hi," said the cat', "\nThe end of the story"]


def test_wrong_or_missing_files_say_what_is_expected(tmp_path):
    tfds_dir = str(tmp_path / "tfds")
    with pytest.raises(FileNotFoundError, match="wiki.test.raw from wikitext-2-raw-v1.zip"):
        data.get_builder("wikitext2", str(tmp_path / "nowhere"), tfds_dir)
    _write(tmp_path / "empty_folder" / "README.txt", "nothing here")
    with pytest.raises(FileNotFoundError, match="no WikiText103 files in .*wiki.test.raw"):
        data.get_builder("wikitext103", str(tmp_path / "empty_folder"), tfds_dir)
    tokens = _write(tmp_path / "wiki.test.tokens", " = Valkyria = \n the <unk> game \n")
    with pytest.raises(ValueError, match="<unk> at byte offset 15: the tokenized wiki.*tokens version"):
        data.get_builder("wikitext2", str(tokens), tfds_dir)
    jsonl = _write(tmp_path / "wiki.jsonl", '{"text": " = Valkyria = "}\n')
    with pytest.raises(ValueError, match="not a WikiText2 file .*not a heading"):
        data.get_builder("wikitext2", str(jsonl), tfds_dir)
    with pytest.raises(ValueError, match="not a PTB file .*capitals.*expected ptb.test.txt"):
        data.get_builder("ptb", str(_write(tmp_path / "p.txt", "The Cat sat\n")), tfds_dir)
    with pytest.raises(ValueError, match=r"not a Lambada file .*byte offset 0 .*expected OpenAI's lambada_test"):
        data.get_builder("lambada", str(_write(tmp_path / "l.txt", "a plain line\n")), tfds_dir)
    with pytest.raises(ValueError, match="not a PTB file .*no <unk>"):
        data.get_builder("ptb", str(_write(tmp_path / "q.txt", "a lower case line\n")), tfds_dir)
    with pytest.raises(ValueError, match="not a PTB file .*JSON"):
        data.get_builder("ptb", str(_write(tmp_path / "r.txt", '{"text": "a"}\n')), tfds_dir)
    with pytest.raises(ValueError, match="not a LM1B file .*JSON"):
        data.get_builder("lm1b", str(_write(tmp_path / "x.json", '{"a": 1}\n')), tfds_dir)
    bad = tmp_path / "ptb.test.txt"
    bad.write_bytes(b" a b\n c \xff d\n")
    with pytest.raises(ValueError, match=r"ptb.test.txt: invalid UTF-8 at byte offset 8"):
        data.get_builder("ptb", str(bad), tfds_dir)
