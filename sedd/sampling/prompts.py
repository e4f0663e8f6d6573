"""Text prompts as the sampling core's conditioning: a prefix, a suffix or an infill template."""

from __future__ import annotations

import numpy as np

MASK_CHAR = "\u2591"  # "░": how a masked position is drawn in text (sedd serve's frames, the playground, --animate)


def check_length(tokenizer, text: str, seq_len: int, name: str) -> None:
    """Refuse, before encoding it, a text longer than seq_len tokens of `tokenizer` can spell.

    A token stands for at most ``tokenizer.max_token_chars`` characters, so a longer text cannot fit, and
    is not encoded to find out. The ValueError names the text (`name`), its length and the bound.
    """
    per_token = getattr(tokenizer, "max_token_chars", 1)
    if len(text) > seq_len * per_token:
        raise ValueError(
            f"{name} of {len(text)} characters is more than the model's sequence length of {seq_len} "
            f"tokens can hold (a token is at most {per_token} character{'s' * (per_token > 1)})"
        )


def text_conditioning(
    tokenizer, seq_len: int, num: int, prefix: str = "", suffix: str = "", infill: str = "", blank: str = "_"
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``fixed_mask`` and ``fixed_tokens`` of ``sample`` from text prompts, or (None, None) without any.

    prefix fills the first positions and suffix the last. An infill template
    fills positions 0, 1, ... with its characters, except `blank`, which marks
    the positions to generate (character-level tokenizers only).

    Returns (bool[B, L], int32[B, L]) of B = num rows and L = seq_len, or (None, None). A ValueError for
    text the tokenizer cannot encode or longer than L, infill with prefix or suffix or with a tokenizer
    that does not map each character to one token, or a blank that is not one character.
    """
    if infill and len(blank) != 1:
        raise ValueError(f"the blank of an infill template must be one character, got {blank!r}")
    if not (prefix or suffix or infill):
        return None, None
    mask = np.zeros(seq_len, bool)
    tokens = np.zeros(seq_len, np.int32)
    if infill:
        if prefix or suffix:
            raise ValueError("an infill template cannot be combined with a prefix or suffix (put them in the template)")
        if len(infill) > seq_len:
            raise ValueError(
                f"the infill template has {len(infill)} characters; the model's sequence length is {seq_len}"
            )
        for i, ch in enumerate(infill):
            if ch != blank:
                ids = tokenizer.encode(ch)
                if len(ids) != 1:
                    raise ValueError(
                        "infill templates need a character-level tokenizer (char, or byte with ASCII text)"
                    )
                mask[i], tokens[i] = True, ids[0]
    else:
        check_length(tokenizer, prefix, seq_len, "the prefix")
        check_length(tokenizer, suffix, seq_len, "the suffix")
        pre = np.asarray(tokenizer.encode(prefix), np.int32) if prefix else np.zeros(0, np.int32)
        suf = np.asarray(tokenizer.encode(suffix), np.int32) if suffix else np.zeros(0, np.int32)
        if len(pre) + len(suf) > seq_len:
            raise ValueError(
                f"prefix ({len(pre)} tokens) + suffix ({len(suf)} tokens) is longer than the "
                f"model's sequence length {seq_len}"
            )
        mask[: len(pre)], tokens[: len(pre)] = True, pre
        if len(suf):
            mask[seq_len - len(suf) :], tokens[seq_len - len(suf) :] = True, suf
    return np.broadcast_to(mask, (num, seq_len)), np.broadcast_to(tokens, (num, seq_len))
