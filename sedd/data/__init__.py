"""Data: tokenizers, TFDS builders (array_record, no TensorFlow), packing, synthetic Markov data.

Documents go through three stages: a TFDS builder turns local files into
array_record splits of records (``sedd.data.records``), streaming, TensorFlow
never imported; a tokenizer turns each split into one int stream, cached as
`.npy` beside them (``sedd.data.text``); `PackedTokens` cuts it into
resumable batches (``sedd.data.packing``). docs/data.md gives the file
formats each builder expects.

Modules: tokenizers, builders (TFDS), zeroshot (the test sets of the paper's
Table 1, with their detokenizers), packing (sequences and batches), text
(cached token streams of a builder), sources (the `code` corpus: source files
byte for byte, by default the standard library), markov (a chain with an exact law);
`load_dataset` picks the one a config's data section names.
"""

import codecs
import logging
from pathlib import Path

import ml_collections

from sedd.data import sources, zeroshot  # noqa: F401  (registers the code and zero-shot builders in BUILDERS)
from sedd.data.builders import BUILDERS, VAL_FRACTION, default_data_dir, get_builder
from sedd.data.records import DOCUMENTS, read_documents, read_pieces
from sedd.data.markov import MarkovChain, MarkovData, load_markov
from sedd.data.packing import PackedTokens, TokenData, tokenize_documents, unigram_entropy_bits
from sedd.data.text import TextData
from sedd.data.tokenizers import (
    EOS_TEXT,
    CharTokenizer,
    GPT2Tokenizer,
    OutOfVocabulary,
    get_tokenizer,
    load_tokenizer,
    save_tokenizer,
    tokenizer_from_dict,
)

__all__ = [
    "BUILDERS",
    "DATASETS",
    "DATA_DEFAULTS",
    "DOCUMENTS",
    "EOS_TEXT",
    "VAL_FRACTION",
    "CharTokenizer",
    "GPT2Tokenizer",
    "MarkovChain",
    "MarkovData",
    "OutOfVocabulary",
    "PackedTokens",
    "TextData",
    "TokenData",
    "check_characters",
    "check_data_dir",
    "data_section",
    "default_data_dir",
    "get_builder",
    "get_tokenizer",
    "load_dataset",
    "load_markov",
    "load_tokenizer",
    "read_documents",
    "read_pieces",
    "sample_prompt",
    "save_tokenizer",
    "tokenize_documents",
    "tokenizer_from_dict",
    "unigram_entropy_bits",
]

DATASETS = ("shakespeare", "text", "text8", "openwebtext", "tinystories", "code", "markov", *zeroshot.ZERO_SHOT)


DATA_DEFAULTS = {
    "name": "shakespeare",
    "path": "",
    "data_dir": "",
    "documents": "",
    "tokenizer": "char",
    "tokenizer_path": "",
    "seq_len": 256,
    "code": {"tests": False, "glob": "*.py", "max_file_bytes": 4 << 20, "max_bytes": 1 << 30},
}
"""What ``load_dataset`` takes for a key its section lacks or holds as None: a notebook's or a test's
partial dict ("" is the builder's own default). A shipped config's data section has every key."""


def data_section(config) -> ml_collections.ConfigDict:
    """A data section (a ConfigDict or a partial dict) completed with ``DATA_DEFAULTS``, read by attribute."""
    given = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
    return ml_collections.ConfigDict({**DATA_DEFAULTS, **{k: v for k, v in given.items() if v is not None}})


def check_data_dir(data_dir: str) -> str:
    """data_dir, refused (ValueError naming data.data_dir) unless it is a folder or can be made one.

    `sedd eval --config.data.data_dir=/dev/null` was a NotADirectoryError traceback from inside TFDS.
    """
    path = Path(data_dir).expanduser()
    first = next((p for p in (path, *path.parents) if p.exists()), None)
    if first is not None and not first.is_dir():
        raise ValueError(
            f"data.data_dir = {data_dir!r}: {first} is not a folder; the prepared data is kept in a "
            "folder (made if absent)"
        )
    return data_dir


def load_dataset(config, tokenizer=None) -> TextData:
    """Builds (once) and loads the dataset a config's `data` section describes.

    config: the `data` ConfigDict (or a dict) whose fields docs/data.md lists ("Config"); tokenizer: one
    restored from a run directory, by default a new one (for "char", the vocabulary of all splits, so
    validation always encodes).
    """
    config = data_section(config)
    if config.name == "markov":  # synthetic data with a known law: drawn, not read from files
        return load_markov(config)
    data_dir = check_data_dir(config.data_dir or default_data_dir())
    builder = _builder(config)
    cache_dir = Path(data_dir) / "sedd_tokens" / builder.name / builder.builder_config.name / str(builder.version)
    if tokenizer is None:
        if config.tokenizer == "char":
            # The vocabulary needs one pass over the corpus: keep it for later runs.
            vocab = cache_dir / "char_vocab.json"
            if not vocab.exists():
                tok = CharTokenizer.from_text(
                    piece for split in builder.info.splits.keys() for piece, _ in read_pieces(builder, split)
                )
                vocab.parent.mkdir(parents=True, exist_ok=True)
                save_tokenizer(tok, vocab)  # atomic (sedd.files.write_text)
            tokenizer = load_tokenizer(vocab)
        elif config.tokenizer == "gpt2":
            tokenizer = GPT2Tokenizer(config.tokenizer_path)
        else:
            tokenizer = get_tokenizer(config.tokenizer)
    return TextData(builder, tokenizer, config.seq_len, cache_dir)


def _builder(config: ml_collections.ConfigDict, prepare: bool = True):
    """The builder of a completed data section (not "markov"): prepared, or (prepare=False) as it is."""
    name = config.name
    if name == "shakespeare" and config.path:
        # The plays are only the default text: `--config.data.path=my.txt` alone
        # trains on the user's file or folder (any *.txt / *.jsonl).
        name = "text"
    options = config.code.to_dict() if name == "code" else None
    data_dir = config.data_dir or default_data_dir()
    if not prepare:
        return BUILDERS[name](path=config.path, data_dir=data_dir, documents=config.documents, **(options or {}))
    return get_builder(name, config.path, data_dir, config.documents, options)


def check_characters(config, tokenizer) -> None:
    """Refuse, before anything is prepared from it, text holding characters a character-level tokenizer lacks.

    Caching the tokens, after preparing, would refuse a character the run's vocabulary lacks (Markdown's `#`,
    code's `=`) only after the work: this reads the documents preparing would write (``TextFiles.split_fragments``)
    first. Data already prepared, synthetic data, data a builder reads some other way, and tokenizers that
    encode any text (byte, GPT-2) pass without reading.

    Raises OutOfVocabulary naming the characters the tokenizer lacks.
    """
    config = data_section(config)
    chars = getattr(tokenizer, "chars", None)  # a CharTokenizer's vocabulary
    if chars is None or config.name == "markov" or config.name not in BUILDERS:
        return
    absl = logging.getLogger("absl")  # its "custom data configuration" lines, as get_builder silences them
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        builder = _builder(config, prepare=False)
        if builder.is_prepared() or not hasattr(builder, "split_fragments"):
            return
    finally:
        absl.setLevel(level)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a fragment may end inside a character
    seen: set[str] = set()
    for _, fragments in builder.split_fragments().values():
        for piece in fragments():
            if piece is not None:  # None ends a document
                seen.update(decoder.decode(piece))
    seen.update(decoder.decode(b"", final=True))
    if unknown := sorted(seen - set(chars)):
        raise OutOfVocabulary(unknown, chars)


def sample_prompt(config, tokenizer, max_chars: int = 24) -> str:
    """A prompt that fits a run's data, for the `--prefix` of the `sedd sample` command `sedd train` suggests.

    The dataset's own where its builder has one (the plays: "ROMEO:"; the
    code corpus: a Python function header), else the opening words of the
    first split's first non-blank line: at most max_chars characters, cut
    after a word where one ends within them. "" where the tokenizer cannot
    write it (a Markov chain's tokens are not text) or the data gives none.
    """
    config = data_section(config)
    if config.name == "markov":
        return ""
    builder = _builder(config)
    prompt = builder.prompt()
    if not prompt:
        splits = list(builder.info.splits.keys())
        text = next(read_pieces(builder, "train" if "train" in splits else splits[0]), ("", True))[0]
        line = next((s.strip() for s in text.splitlines() if s.strip()), "")
        prompt = line[:max_chars]
        if len(line) > max_chars and " " in prompt:
            prompt = prompt[: prompt.rindex(" ")].rstrip()
    try:
        tokenizer.encode(prompt)
    except ValueError:
        return ""
    return prompt
