r"""The autoregressive baseline: DDiT with causal attention and no time input, a causal language model.

The same backbone as the diffusion model, trained by the same ``sedd train``
on the exact NLL (``sedd.kinds.causal``, which it shares with the spec kind's
causal half): the likelihood and speed baseline of the benchmarks, and a judge
of generative perplexity (``sedd.figures.judge_nll``).

Speculative sampling (``speculative_sample``): the network is the target of
``sedd.speculative``, its drafts from any ``sedd.drafts.Drafter``; a smaller
AR run drafts as an ``ARDraft``. With ``model.draft_head = N`` the run has a
draft head of its own (``sedd.kinds.draft_head``) and samples in rounds of
its drafts by default, their layout timed on the device (``sedd.kinds.layouts``).

Letters: B batch, L length, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from sedd import drafts, sampling, speculative, validate
import sedd.kinds.causal as causal
import sedd.kinds.draft_head as draft_head
from sedd.kinds import base, layouts
from sedd.kinds.base import network_of, register
from sedd.kinds.capabilities import Drafts, Speculates, Tunes, check_given
from sedd.sampling import shaped_law


# --------------------------------------------------------------------------- an AR run as the drafter of another


def drafter_parts(graphdef, temperature=1.0) -> tuple:
    r"""(prefill, drafter) of a (smaller) AR network for ``sedd.speculative.decode``: k tokens left to right.

    Each round writes the row's cache from `start` on (as ``causal.speculative_target``: the slots of
    rejected drafts are written over before they are seen) and runs k + 1 one-position steps: step i
    feeds the input at position start + i and draws y_i from the network's law at temperature T (T = 0:
    its argmax; a traced value serves every T), so q_i = that law given the prefix and y_<i, (1) of
    ``sedd.speculative``; the last step only feeds y_{k-1}, so that the cache holds every position a
    round can accept (all k and the extra token).

    Its cache holds max(max_len, P) + MAX_DRAFTS + 1 slots, as the target's: a text longer than the draft
    network's max_len (a draft run trained on shorter texts) is refused by name at the first round.

    Returns:
      prefill(params_state, prompt int32[B, P]) -> state (``causal.build_speculative_target``'s);
      drafter as ``decode`` takes it.
    """
    prefill, _ = causal.build_speculative_target(graphdef)

    def drafter(key, state, text, start, k):
        params_state, cache = state
        model = nnx.merge(graphdef, *params_state)
        causal.fits(cache, text)
        b = text.shape[0]
        prev = causal.inputs(model, text, start, 1)[:, 0]  # (B,) x_{start-1}, BOS at 0
        keys = jax.random.split(key, b)
        ys, qs = [], []
        for i in range(k + 1):  # the rows together, each at its own position start + i
            logits, cache, _ = causal.decode_rows(model, cache, prev[:, None], start + i)  # (B, 1, V)
            if i == k:
                break
            q = shaped_law(logits[:, 0], temperature, 1.0)  # (B, V)
            prev = jax.vmap(lambda key, q: jax.random.categorical(jax.random.fold_in(key, i), jnp.log(q)))(
                keys, q
            ).astype(jnp.int32)
            ys.append(prev), qs.append(q)
        if not k:
            return jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, 0, model.out_dim), jnp.float32), (params_state, cache)
        return jnp.stack(ys, 1), jnp.stack(qs, 1), (params_state, cache)

    return prefill, drafter


@functools.lru_cache(maxsize=None)
def cached_drafter_parts(graphdef, *, temperature: float = 1.0) -> tuple:
    """``drafter_parts`` of a Python temperature, cached."""
    return drafter_parts(graphdef, temperature)


class ARDraft(drafts.Drafter):
    """A smaller AR network as the drafter of an AR target: k tokens left to right, k + 1 calls a round.

    Attributes:
      graphdef, state: the draft network (state = (params, rest)); vocab: its V.
    """

    name = "ar"

    def __init__(self, graphdef, state):
        self.graphdef, self.state = graphdef, state
        self.vocab = nnx.merge(graphdef, *state).out_dim

    def calls(self, k):
        return k + 1

    def parts(self, temperature, top_p):
        """``drafter_parts`` (top_p does not apply: the drafts are drawn at temperature alone)."""
        return drafter_parts(self.graphdef, temperature)

    def cached_parts(self, temperature, top_p):
        return cached_drafter_parts(self.graphdef, temperature=temperature)


def speculative_sample(
    key: jax.Array,
    graphdef,
    state,
    num_samples: int,
    length: int,
    k: int = drafts.DEFAULT_K,
    draft: Any = "ngram",
    temperature: float = 1.0,
    top_p: float = 1.0,
    prompt: jax.Array | None = None,
    verification: str = "joint",
) -> tuple[jax.Array, dict]:
    """Text of the AR network (graphdef, state) by speculative sampling (``sedd.speculative``): its law exactly.

    Arguments as ``sedd.kinds.spec.speculate``'s, and k drafts a round from `draft`, "ngram" or a
    ``sedd.drafts.Drafter`` over the same vocabulary (its refusals are ValueErrors). temperature and top_p
    act on the target's law, so the text's (on the drafter's they only change the acceptance). Returns
    (int32[B, L], stats): "nfe" the target's calls, "nfe_per_sample", "draft_calls" the drafter's a row,
    "accepted_at" int32[k].
    """
    vocab = nnx.merge(graphdef, *state).out_dim
    draft = drafts.get(draft, vocab)
    k = draft.checked(vocab, k)
    prefill, target = causal.speculative_target(graphdef, temperature=temperature, top_p=top_p)
    d_prefill, drafter = draft.cached_parts(temperature, top_p)
    given = jnp.zeros((num_samples, 0), jnp.int32) if prompt is None else jnp.asarray(prompt, jnp.int32)
    out, stats = speculative.decode_prompted(
        key,
        state,
        draft.state,
        given,
        prefill=prefill,
        target=target,
        d_prefill=d_prefill,
        drafter=drafter,
        length=length,
        k=k,
        verification=verification,
    )
    return out, speculative.counted(stats, 0, draft.calls(k))


# =========================================================================== the kind


@dataclasses.dataclass(frozen=True)
class AROptions(causal.RoundOptions):
    """``causal.RoundOptions`` of an AR run: a draft of another run (``speculative_sample``), or the rounds of its
    draft head (a layout ``draft_head.layout_of`` reads, draft_temperature its drafts' tau)."""

    def checked(self):
        if self.draft is not None and (self.layout is not None or self.draft_temperature is not None):
            raise ValueError(
                "layout and draft_temperature are for the rounds of a run's own draft head; with a draft "
                "(--draft), give draft_k"
            )
        return super().checked()


@register("ar", reads=("model.draft_k", "model.draft_head", "training.draft_weight", "training.draft_target"))
class Autoregressive(causal.CausalKind, Speculates, Drafts, Tunes):
    """The AR baseline: a causal DDiT without a time input, trained on the next-token NLL (module docstring).

    With model.draft_head = N > 0 a draft head of width N drafts for it (``sedd.kinds.draft_head``): trained
    beside the NLL, it samples in rounds of its drafts by default, the AR network's law exactly.

    Attributes:
      head_width: N, model.draft_head (0: no head).
      draft_k: with a head, the drafts a round it was trained to draft (model.draft_k).
      layout: with a head, the round's ``draft_head.HeadLayout`` when none is given: k = draft_k until
        ``tune`` sets the fastest here; None without a head.
    """

    options_type = AROptions

    def __init__(self, config):
        super().__init__(config)
        width = config.model.draft_head
        if isinstance(width, bool) or not (isinstance(width, int) and 0 <= width <= validate.MAX_DRAFT_HEAD):
            raise ValueError(
                f"model.draft_head={width!r} (the width of an AR run's draft head) must be an integer in "
                f"[0, {validate.MAX_DRAFT_HEAD}]: 0 for none, N > 0 for a head of width N (256 is a good start)"
            )
        self.head_width, self.layout = width, None
        if width:
            self.draft_k, self.draft_weight, self.draft_target = causal.draft_training(config, "a draft head")
            self.layout = draft_head.HeadLayout(self.draft_k)

    @property
    def label(self):
        return f"ar head={self.head_width} k={self.draft_k}" if self.head_width else "ar"

    def describe(self):
        return {"kind": self.name} | ({"draft_head": self.head_width} if self.head_width else {})

    def _head_layout(self, o: AROptions) -> draft_head.HeadLayout | None:
        """The head's layout a sample with options `o` runs; None with a draft or without a head. Every option
        is checked against the run here, before any timing: a draft_k or a layout past its trained k, a
        draft_k that is not the layout's, or a head's option for a run without one."""
        if o.draft is not None:
            return None
        if not self.head_width:
            if o.draft_k is not None:
                raise ValueError(drafts.NEEDS_A_DRAFT)
            given = {"layout": o.layout, "draft_temperature": o.draft_temperature}
            given = [f"{n}={v!r}" for n, v in given.items() if v is not None]
            given += [f"verification={o.verification!r}"] * (o.verification != "joint")
            if given:
                raise ValueError(
                    f"{', '.join(given)}: layout, draft_temperature and verification are for speculative sampling: "
                    "this AR run has no draft head (model.draft_head = 0); give a draft (--draft)"
                )
            return None
        layout = self.layout if o.layout is None else draft_head.layout_of(o.layout, self.draft_k)
        if o.draft_k is not None:
            asked = draft_head.layout_of(o.draft_k, self.draft_k, "draft_k")
            if o.layout is not None and asked != layout:
                raise ValueError(
                    f"draft_k={o.draft_k!r}: this run drafts {layout.k} token{'s' * (layout.k != 1)} a round "
                    f"in its layout ({layout}); give one of them"
                )
            layout = asked
        return layout

    def tune(self, net, options=None, workdir=None, batch=1, progress=False):
        """A head run's layout (``self.layout``, what ``sample`` and ``sedd serve`` use): the layout or draft_k of
        `options` when given (not kept), else the fastest here of ``draft_head.candidates`` (``layouts.settle``,
        kept in workdir). None without a head, or with a draft. options: every one checked before any timing."""
        o = self.options(**dict(options or {}))
        layout = self._head_layout(o)
        if layout is None:
            return None
        asked = layout if o.layout is not None or o.draft_k is not None else None
        candidates, length = draft_head.candidates(self.draft_k), self.config.data.seq_len
        self.layout, line = layouts.settle(
            asked, candidates, draft_head.speculate, net, length, batch, workdir, progress
        )
        return line

    def speculation(self, graphdef, draft=None, k=None, draft_name=None):
        """Speculative rounds of this network as the target (``causal.build_speculative_target``).

        draft: None (a head run: its head's rounds, ``draft_head.speculative_parts``; else no drafts: k = 0,
        each round one call that writes one token, ancestral sampling with the KV cache), "ngram" or a
        ``sedd.drafts.Drafter`` of another run, checked by it (``Drafter.checked``). The drafter draws at
        the row's temperature.
        """
        vocab, categorical = self.config.vocab_size, self.config.sampling.categorical
        layout = self._head_layout(self.options(draft=draft, draft_k=k))
        if layout is not None and layout.k:

            def head_parts(temperature, top_p):
                prefill, target, drafter = draft_head.speculative_parts(graphdef, layout, temperature, top_p)
                return (lambda state, text: (prefill(state, text), None)), target, drafter

            return sampling.rounds.Speculation(
                head_parts, layout.k, "head", categorical=categorical, shared=True, draft_calls=layout.k
            )
        draft = drafts.get(draft, vocab)
        if draft is None:
            return causal.without_drafts(graphdef, vocab, categorical)
        k = draft.checked(vocab, drafts.DEFAULT_K if k is None else k)

        def parts(temperature, top_p):
            t_prefill, target = causal.build_speculative_target(graphdef, temperature, top_p)
            d_prefill, drafter = draft.parts(temperature, top_p)
            if draft.state is None:
                return (lambda state, prompt: (t_prefill(state, prompt), None)), target, drafter
            return (lambda state, prompt: (t_prefill(state[0], prompt), d_prefill(state[1], prompt))), target, drafter

        return sampling.rounds.Speculation(
            parts,
            k,
            draft_name or draft.name,
            draft_calls=draft.calls(k),
            draft_state=draft.state,
            categorical=categorical,
        )

    def network(self, seed=0):
        """Inputs V + 1 ids (BOS = V), outputs the V next-token logits, causal attention, no time input; with
        model.draft_head, a draft head beside it (``draft_head.attach``)."""
        v = self.config.vocab_size
        model = network_of(self.config, seed, num_tokens=v + 1, out_dim=v, causal=True, **causal.LM_ARCH)
        return draft_head.attach(model, self.head_width, seed) if self.head_width else model

    def params_from(self, source, params):
        """An AR run of this size, with or without a draft head: a run without one starts this run's head as
        initialised (the head trains on the network's features held fixed, so the network trains as an AR run
        continued, ``draft_head.loss``)."""
        return base.transfer(params, source.params, str(source.config.model.kind), fresh="draft_head")

    def loss(self, key, model, x0, train, rngs=None):
        """-sum_l log p(x0^l | x0^{<l}), the exact NLL (``causal.sequence_nll``; training.loss_chunk); with a
        draft head, (2) of ``sedd.kinds.draft_head``: the NLL plus the head's cross-entropy."""
        if self.head_width:
            return self._draft_loss(draft_head.loss, key, model, x0, train, rngs)
        return causal.sequence_nll(model, x0, deterministic=not train, rngs=rngs, chunk=self.config.training.loss_chunk)

    def sample(self, key, net, num_samples, steps=None, sampler=None, **options):
        """L ancestral steps with the KV cache (``causal.ancestral``; temperature 0 the argmax); a head run in
        rounds of its head's drafts (``draft_head.speculate``, its layout ``self.layout`` or the one given).

        With draft: speculative sampling (``speculative_sample``), the same law in fewer calls of this
        network, draft_k drafts a round (default ``sedd.drafts.DEFAULT_K``). A prompt is a prefix of the same
        length in every row. steps, a sampler, an option ``options`` refuses, draft_k without a draft or a
        head, a drafter's refusal or a layout past the head's k is a ValueError.
        """
        check_given(self, steps=steps, sampler=sampler)
        o = self.options(**options)
        length = self.config.data.seq_len
        shaping = dict(temperature=o.temperature, top_p=o.top_p, prompt=o.prompt)
        if o.draft is not None:
            k = drafts.DEFAULT_K if o.draft_k is None else o.draft_k
            tokens, stats = speculative_sample(
                key, net.graphdef, net.state, num_samples, length, k, o.draft, verification=o.verification, **shaping
            )
        elif (layout := self._head_layout(o)) is not None:
            tokens, stats = draft_head.speculate(
                key,
                net.graphdef,
                net.state,
                num_samples,
                length,
                layout,
                categorical=o.categorical,
                verification=o.verification,
                draft_temperature=o.draft_temperature,
                **shaping,
            )
        else:  # one network call a position, each on one position of every row
            tokens, stats = causal.ancestral_counted(
                key, net.graphdef, net.state, num_samples, length, o.temperature, o.prompt, o.categorical, o.top_p
            )
        return sampling.Samples(tokens, None, stats if o.return_stats else None)

    def drafter(self, net):
        """Drafts left to right, k + 1 calls a round (``ARDraft``)."""
        return ARDraft(net.graphdef, net.state)
