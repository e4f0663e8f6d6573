r"""Drafting: what proposes the k tokens a target checks in one call of speculative decoding.

``sedd.speculative`` keeps the target's law whatever the drafts are, as long
as each draft y_i was drawn from a known law q_i given the prefix and the
drafts before it ((1) there). A ``Drafter`` is one such source, as a value:

  ``Ngram``       prompt lookup (Saxena 2023): the continuation of the last
                  match of the last two tokens; no network call, any k.
  ``ARDraft``     a smaller AR run (``sedd.kinds.ar``): k tokens left to
                  right, k + 1 calls a round.
  ``BlockDraft``  a block-diffusion run (``sedd.kinds.block``): one block of
                  k <= b positions at t = 1 in one call.

The network drafters are built by their run's kind (``Kind.drafter(net)``).
Each drafter states its vocabulary and its most drafts a round, and
``checked`` holds every draft to them in one place, with one message each,
whatever asks (``Run.sample``, `sedd sample --draft`, `sedd serve --draft`).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from sedd import speculative, validate

DEFAULT_K = 4
"""Drafts a round when none is asked for (``draft_k``)."""

NEEDS_A_DRAFT = "draft_k needs a draft: give --draft ngram, --draft SMALL_AR_RUN_DIR or --draft BLOCK_RUN_DIR"
"""The refusal of a draft_k given without a draft, to a run that takes drafts."""


def check_k(k, most: int = speculative.MAX_DRAFTS, why: str = "sedd.speculative.MAX_DRAFTS") -> int:
    """k drafts a round, checked: an integer in [1, most]; `why` names what sets `most`.

    Raises:
      ValueError: one line, "draft_k must be an integer in [1, most] (drafts a round, at most why), got k"
        (``sedd.validate.draft_k_bound``, the command line's bound).
    """
    validate.draft_k_bound(most, why).check("draft_k", k)
    return k


class Drafter:
    """A source of drafts for an autoregressive target (see the module docstring).

    Attributes:
      name: what a server reports as the draft when no run name is given.
      vocab: the V tokens it drafts over.
      state: a draft network's (params, rest), what ``parts``' prefill reads; None without a network.
    """

    name: ClassVar[str] = "draft"
    vocab: int
    state: Any = None

    def most(self) -> tuple[int, str]:
        """(the most drafts a round this drafter gives, what sets it)."""
        return speculative.MAX_DRAFTS, "sedd.speculative.MAX_DRAFTS"

    def checked(self, vocab: int, k) -> int:
        """k, once this drafter can draft k tokens a round for a target over `vocab` tokens.

        Raises:
          ValueError: another vocabulary, or k outside [1, ``most``] (``check_k``), one line each.
        """
        if self.vocab != vocab:
            raise ValueError(f"the draft run's vocabulary ({self.vocab} tokens) differs from this run's ({vocab})")
        return check_k(k, *self.most())

    def calls(self, k: int) -> int:
        """Network calls the drafter makes a round of k drafts."""
        return 0

    def parts(self, temperature, top_p) -> tuple[Callable, Callable]:
        """(prefill, drafter) for ``sedd.speculative.decode``: prefill(state, prompt int32[B, P]) -> the drafter's
        state, drafter(key, state, text, start, k) -> (drafted int32[B, k], q float32[B, k, V], state).

        temperature and top_p may be traced float32[] values; the drafts are drawn at them (the law of the
        text is the target's whatever they are: only the acceptance changes).
        """
        raise NotImplementedError

    def cached_parts(self, temperature: float, top_p: float) -> tuple[Callable, Callable]:
        """``parts`` of Python values, the same function objects for the same values (compiled once)."""
        return self.parts(temperature, top_p)


class Ngram(Drafter):
    """Prompt lookup (``sedd.speculative.ngram_drafter``): no network, no state, no call."""

    name = "ngram"

    def __init__(self, vocab: int):
        self.vocab = vocab

    def parts(self, temperature, top_p):
        return _no_state, speculative.ngram_drafter(self.vocab)


def _no_state(state, prompt) -> None:
    return None


def get(draft, vocab: int) -> Drafter | None:
    """The drafter of a `draft` option: None (no drafts), "ngram" (for a target over `vocab` tokens) or a Drafter.

    Raises:
      ValueError: anything else, in one line.
    """
    if draft is None or isinstance(draft, Drafter):
        return draft
    if isinstance(draft, str) and draft == "ngram":
        return Ngram(vocab)
    raise ValueError(f"draft must be 'ngram', a smaller AR run or a block-diffusion run, got {draft!r}")
