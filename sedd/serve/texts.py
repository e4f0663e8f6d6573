"""Token ids as text: a completion, the frames of a diffusing stream, and text streamed as it settles."""

from __future__ import annotations

import logging

import numpy as np

from sedd import runs
from sedd.sampling.prompts import MASK_CHAR
from sedd.serve.api import Plan


logger = logging.getLogger("sedd.serve")


class Texts:
    """Token ids of a run as completion text and as the frames of a diffusing stream."""

    def __init__(self, run: runs.Run):
        self.run = run
        self.tok = run.tokenizer
        self.mask_id = run.kind.unwritten_id()  # MASK, or the id of a position an AR run has not written
        self.eos_id = getattr(self.tok, "eos_id", None)
        self.pieces: dict[int, str] = {}

    def piece(self, i: int) -> str:
        """The text of one token id (MASK_CHAR for the mask), decoded once."""
        if i not in self.pieces:
            self.pieces[i] = MASK_CHAR if i == self.mask_id else self.tok.decode([i])
        return self.pieces[i]

    def completion(self, ids: np.ndarray, p: Plan, stop: list[str]) -> tuple[str, str]:
        """(text, finish_reason) of one row int[L]: the completion span, cut at EOS or a stop string."""
        span = ids[p.start : p.start + p.length]
        reason = "length"
        if self.eos_id is not None and (span == self.eos_id).any():
            span, reason = span[: int(np.argmax(span == self.eos_id))], "stop"
        text = self.tok.decode(span) if len(span) else ""
        cuts = [text.find(s) for s in stop if s and s in text]
        if cuts:
            text, reason = text[: min(cuts)], "stop"
        return text, reason

    def frame(self, ids: np.ndarray, p: Plan, prompt: str, suffix: str) -> tuple[str, list[int]]:
        """(text, masked character offsets) of one state int[L]: prompt + span + suffix, masks shown as MASK_CHAR."""
        out, masked, at = [prompt], [], len(prompt)
        for i in ids[p.start : p.start + p.length].tolist():
            s = self.piece(int(i))
            if i == self.mask_id:
                masked.append(at)
            out.append(s)
            at += len(s)
        out.append(suffix)
        return "".join(out), masked

    def round(self, r: dict, p: Plan) -> dict:
        """One speculative round of a row (``sedd.sampling.rounds.Rounds``) as text, at its offset in the completion.

        Returns {"round", "offset" (tokens written before it), "drafted" (the drafts' texts), "accepted" (how
        many of them were kept), "written" (the text of the token written after them)}.
        """
        return {
            "round": r["round"],
            "offset": r["start"] - p.start,
            "drafted": [self.piece(y) for y in r["drafted"]],
            "accepted": r["accepted"],
            "written": self.piece(r["written"]),
        }


class Streamed:
    """The text of each choice of a `stream: true` request, sent as it can no longer change.

    With a sampler that settles (``sedd.kinds.Kind.settles``), the longest prefix of the completion
    without a mask is final; its text, cut at an end-of-text token or a
    `stop` string, is sent except for the last len(longest stop) - 1
    characters (a stop string could still begin there) and a trailing U+FFFD
    (a character whose bytes are not all unmasked yet). So the chunks a choice
    receives always concatenate to its final text.
    """

    def __init__(self, texts: Texts, p: Plan, stop: list[str]):
        self.texts, self.p, self.stop = texts, p, [s for s in stop if s]
        self.sent = [""] * p.n
        self.done = [False] * p.n
        self.hold = max((len(s) for s in self.stop), default=1) - 1

    def update(self, i: int, ids: np.ndarray) -> str:
        """The text choice i adds with its state ids int[L] (often ""); it is then counted as sent."""
        if self.done[i]:
            return ""
        p, tx = self.p, self.texts
        span = ids[p.start : p.start + p.length]
        masked = span == tx.mask_id
        final = not masked.any()  # no mask left: the denoise changes nothing, this is the answer
        span = span[: int(np.argmax(masked))] if not final else span
        if tx.eos_id is not None and (span == tx.eos_id).any():
            span, final = span[: int(np.argmax(span == tx.eos_id))], True
        text = tx.tok.decode(span) if len(span) else ""
        cut = min((text.find(s) for s in self.stop if s in text), default=None)
        safe = len(text) if final else len(text.rstrip("\ufffd")) - self.hold
        if cut is not None and cut <= safe:  # any earlier stop string would lie inside the text: found
            text, final = text[:cut], True
        elif not final:
            text = text[: max(safe, 0)]
        self.done[i] = final
        return self._extend(i, text)

    def rest(self, i: int, text: str) -> str:
        """What choice i still has to send of its final text."""
        self.done[i] = True
        return self._extend(i, text)

    def _extend(self, i: int, text: str) -> str:
        sent = self.sent[i]
        if len(text) <= len(sent):
            return ""
        if not text.startswith(sent):  # cannot happen with a sampler that settles; never send text twice
            logger.warning("sedd serve: a streamed choice changed after it was sent (%r, then %r)", sent, text)
            return ""
        self.sent[i] = text
        return text[len(sent) :]
