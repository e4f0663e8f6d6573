"""A tokenizer's cost on load is bounded by what it holds, and its ids are the model's exactly (issue 83, findings
3, 7 and 9).

One added token of 60 MB in a run's GPT-2 tokenizer.json (under the 64 MiB bound on the file) took `sedd sample`
to 4.8 GB (0.54 GB with the plain tokenizer), made the prompt's length check stop binding (the longest token was
10 million characters) and was copied into a new run by `sedd convert`; a vocab id of 4294967295 ended in numpy's
OverflowError at the first prompt; a Split that removes its matches encoded every prompt to nothing; BPE dropout
encoded a text differently call to call; 50 tokens of one id decoded "ROMEO:" as "EOEOOO"; an id of 1,000,001 was
caught only at sampling. Each is now refused where a tokenizer is read (``GPT2Tokenizer``: a run's tokenizer for
`sedd sample`, `eval`, `serve`, a resume, a teacher; `sedd convert`), in one line, before anything is built
from what the file holds past its bounds.
"""

import json
import shutil
import subprocess
import sys
import time

import pytest

from sedd import cli, runs
from sedd.data import GPT2Tokenizer
from sedd.data import tokenizers as tok_lib

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def bpe_tree():
    """The tokenizer.json of a byte-level BPE trained here (GPT-2's steps), as a dict."""
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        ["ROMEO: the cat sat on the mat, and the dog ate 1,234 bones."] * 20,
        vocab_size=300,
        min_frequency=1,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    return json.loads(bpe.to_str())


@pytest.fixture
def received(tiny_run, tmp_path):
    workdir = tmp_path / "received"
    shutil.copytree(tiny_run[0], workdir)
    return workdir


def _changed(tree: dict, change) -> dict:
    tree = json.loads(json.dumps(tree))
    change(tree)
    return tree


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"sedd {command}: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _added(tree, content, i=299, special=False):
    tree["added_tokens"].append(dict(tree["added_tokens"][0], id=i, content=content, special=special))


def _share_an_id(tree):  # 50 tokens of one id (was: "ROMEO:" decoded as "EOEOOO")
    vocab = tree["model"]["vocab"]
    for token in sorted(vocab)[:50]:
        vocab[token] = 7


HOSTILE = {  # name: (what is changed, what the one line says)
    "an added token of 2,000,000 characters": (
        lambda t: _added(t, "x" * 2_000_000),
        "holds an added token of 2,000,000 characters; a tokenizer sedd reads adds at most 1024",
    ),
    "1,025 added tokens": (
        lambda t: [_added(t, f"<|{i}|>", i=1000 + i) for i in range(1025)],
        "holds 1,026 added tokens",
    ),
    "a vocab token of 2,000 characters (the prompt check stopped binding)": (
        lambda t: t["model"]["vocab"].update({"y" * 2000: 299}),
        "a token of 2,000 characters; at most 1024 are read",
    ),
    "the vocab id 4294967295 (numpy's OverflowError at the first prompt)": (
        lambda t: t["model"]["vocab"].update({"Ġthe": 4294967295}),
        "has the id 4294967295, outside the model's [0, 50257)",
    ),
    "the vocab id 1,000,001 (caught only at sampling)": (
        lambda t: t["model"]["vocab"].update({"Ġthe": 1_000_001}),
        "has the id 1000001, outside the model's [0, 50257)",
    ),
    "50 tokens of one id": (_share_an_id, "share the id 7; an id is one token's"),
    "a Split that removes its matches": (
        lambda t: t.update(
            pre_tokenizer={
                "type": "Sequence",
                "pretokenizers": [
                    {
                        "type": "Split",
                        "pattern": {"Regex": tok_lib.GPT2_PATTERN},
                        "behavior": "Removed",
                        "invert": False,
                    },
                    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
                ],
            }
        ),
        "Split has behavior 'Removed' and invert False",
    ),
    "BPE dropout 0.1": (lambda t: t["model"].update(dropout=0.1), "model has BPE dropout 0.1"),
    "a normalizer's string of 70,000 characters": (
        lambda t: t.update(normalizer={"type": "Replace", "pattern": {"String": "a"}, "content": "b" * 70_000}),
        "holds a string of 70,000 characters in its steps",
    ),
    "1,100,000 values": (
        lambda t: t.update(truncation={"pad": [[]] * 1_100_000}),
        "values or lines; a tokenizer sedd reads holds at most 1,048,576",
    ),
    "JSON nested 100,000 deep": (None, "is not JSON: RecursionError"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_tokenizer_that_holds_too_much_or_ids_not_the_models_is_refused_when_read(bpe_tree, tmp_path, name):
    change, says = HOSTILE[name]
    path = tmp_path / "tokenizer.json"
    if change is None:
        path.write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    else:
        path.write_text(json.dumps(_changed(bpe_tree, change)))
    t0 = time.monotonic()
    with pytest.raises(ValueError) as e:
        GPT2Tokenizer(str(path))
    assert says in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert time.monotonic() - t0 < 5


def test_sample_and_convert_refuse_such_a_tokenizer_in_one_line(bpe_tree, received, tmp_path, capsys):
    """`sedd convert` copied the 60 MB token into a new run; a vocab id of 2**32 - 1 ended in a traceback at the
    first prompt (`sedd sample --prefix " the"`). Both in one line now; nothing written."""
    for name in (
        "an added token of 2,000,000 characters",
        "the vocab id 4294967295 (numpy's OverflowError at the first prompt)",
    ):
        change, says = HOSTILE[name]
        hostile = tmp_path / "hostile.json"
        hostile.write_text(json.dumps(_changed(bpe_tree, change)))
        assert cli.main(["convert", str(tmp_path), str(tmp_path / "run"), "--tokenizer_path", str(hostile)]) == 2
        assert says in _one_line(capsys, "convert") and not (tmp_path / "run").exists()
        (received / runs.TOKENIZER).write_text(json.dumps({"name": "gpt2", "path": str(hostile)}))
        argv = ["sample", "--workdir", str(received), "--steps", "2", "--num_samples", "1", "--prefix", " the"]
        assert cli.main(argv) == 2
        assert says in _one_line(capsys, "sample")


def test_gpt2s_layout_of_two_files_is_bounded_the_same_way(gpt2_files, tmp_path):
    """vocab.json + merges.txt (the peers' layout): the same ids, the same bounds on what they hold."""
    assert GPT2Tokenizer(str(gpt2_files)).encode("the cat").size  # read as before
    for name, change, says in (
        ("vocab.json", lambda v: v.update({t: 3 for t in list(v)[:5]}), "share the id 3"),
        ("vocab.json", lambda v: v.update({"Ġthe": 70_000}), "has the id 70000, outside"),
        ("merges.txt", None, "values or lines; a tokenizer sedd reads holds at most"),
    ):
        folder = tmp_path / f"{name}-{says[:8]}"
        shutil.copytree(gpt2_files, folder)
        if change is None:
            (folder / name).write_text((folder / name).read_text() + "a b\n" * 1_100_000)
        else:
            vocab = json.loads((folder / name).read_text())
            change(vocab)
            (folder / name).write_text(json.dumps(vocab))
        with pytest.raises(ValueError) as e:
            GPT2Tokenizer(str(folder))
        assert says in str(e.value) and name in str(e.value), str(e.value)


def test_the_known_tokenizers_still_load_and_the_prompt_check_binds(bpe_tree, tmp_path):
    """GPT-2's steps, and its added <|endoftext|> of its own id: read, encoded as the package does; the longest
    token bounds a prompt's length in characters (``sampling.check_length``)."""
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(bpe_tree))
    tok = GPT2Tokenizer(str(path))
    want = tokenizers.Tokenizer.from_str(json.dumps(bpe_tree)).encode("ROMEO: the cat", add_special_tokens=False)
    assert tok.encode("ROMEO: the cat").tolist() == want.ids and tok.decode(want.ids) == "ROMEO: the cat"
    assert tok.max_token_chars <= tok_lib.MAX_TOKEN_CHARS
    # An added token the file gives another token's id: the package gives it an id of its own (made exact).
    path.write_text(json.dumps(_changed(bpe_tree, lambda t: _added(t, "<|mine|>", i=5))))
    tok = GPT2Tokenizer(str(path))
    mine = tok.encode("<|mine|>").tolist()
    assert len(mine) == 1 and mine != tok.encode("%").tolist() and tok.decode(mine) == "<|mine|>"


@pytest.mark.slow
def test_a_60_mb_added_token_costs_no_more_than_its_bytes(bpe_tree, tmp_path):
    """The finding as written: one added token of 60 MB. Read in a fresh Python, its peak RSS grows by about the
    file's parse (was 4.3 GB and 19 s to build, against 0.54 GB for the whole `sedd sample` of the plain one)."""
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(_changed(bpe_tree, lambda t: _added(t, "x" * 60_000_000))))
    code = (
        "import resource, sys, time\n"
        "from sedd.data import GPT2Tokenizer\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "t = time.monotonic()\n"
        "try:\n"
        f"    GPT2Tokenizer({str(path)!r})\n"
        "except ValueError as e:\n"
        "    print(str(e)[:200])\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024, time.monotonic() - t)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    said, figures = out.strip().splitlines()
    grew_mb, seconds = int(figures.split()[0]), float(figures.split()[1])
    assert "an added token of 60,000,000 characters" in said
    assert grew_mb < 400 and seconds < 5, (grew_mb, seconds)
