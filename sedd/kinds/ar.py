"""The autoregressive baseline as a kind (``sedd.ar``): the causal DDiT, the exact NLL, ancestral and speculative sampling."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from sedd import ar, block, evaluate, sampling, speculative
from sedd.kinds.base import Kind, Net, network_of, prefix_prompt, register


def draft_k_checked(k, length: int) -> int:
    """k checked: an integer in [1, min(MAX_DRAFTS, length)] (drafts a round, ``sedd.speculative.MAX_DRAFTS``)."""
    high = min(speculative.MAX_DRAFTS, length)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= high:
        raise ValueError(f"draft_k must be an integer in [1, {high}] (drafts a round), got {k!r}")
    return k


@register("ar")
class Autoregressive(Kind):
    """The AR baseline: a causal DDiT without a time input, trained on the next-token NLL (``sedd.ar``)."""

    exact = True
    conditions = ("prefix",)  # it writes after a prompt only

    def unwritten_id(self):
        """V, the BOS id: never a token of the text."""
        return self.config.vocab_size

    def settles(self, sampler):
        """Always: each token written stays."""
        return True

    def speculation(self, graphdef, draft=None, k=None, draft_name=None):
        """Speculative rounds of this network as the target (``sedd.ar.build_speculative_target``).

        draft "ngram" (prompt lookup, ``sedd.speculative.ngram_drafter``) or a ``Net`` of a smaller AR
        network over the same vocabulary (``sedd.ar.build_speculative_drafter``, k + 1 calls a round);
        None: no drafts, k = 0, each round one call that writes one token (ancestral sampling with the
        KV cache). The drafter draws at the row's temperature.
        """
        length, vocab = self.config.data.seq_len, self.config.vocab_size
        categorical = self.config.sampling.categorical
        if draft is None:
            if k is not None:
                raise ValueError("draft_k needs a draft: give --draft ngram or --draft SMALL_AR_RUN_DIR")
            k, draft_name = 0, None
        else:
            k = draft_k_checked(4 if k is None else k, length)
        if isinstance(draft, block.BlockDraft):
            return self._block_speculation(graphdef, draft, k, draft_name)
        if draft is None or isinstance(draft, str):
            if draft is not None and draft != "ngram":
                raise ValueError(f"draft must be 'ngram' or a smaller AR run, got {draft!r}")
            drafter = speculative.ngram_drafter(vocab)

            def parts(temperature, top_p):
                prefill, target = ar.build_speculative_target(graphdef, temperature, top_p)
                return (lambda state, prompt: (prefill(state, prompt), None)), target, drafter

            return sampling.rounds.Speculation(parts, k, draft and "ngram", categorical=categorical)
        d_model = draft.model
        if not (d_model.causal and not d_model.time_conditioning and d_model.num_tokens == d_model.out_dim + 1):
            raise ValueError("the draft run is not an AR run (model.kind='ar'): only an AR network drafts left to "
                             "right with the law each draft was drawn from")
        if d_model.out_dim != vocab:
            raise ValueError(f"the draft run's vocabulary ({d_model.out_dim} tokens) differs from this run's ({vocab})")

        def parts(temperature, top_p):
            t_prefill, target = ar.build_speculative_target(graphdef, temperature, top_p)
            d_prefill, drafter = ar.build_speculative_drafter(draft.graphdef, temperature)
            return (lambda state, prompt: (t_prefill(state[0], prompt), d_prefill(state[1], prompt))), target, drafter

        return sampling.rounds.Speculation(parts, k, draft_name or "ar", draft_calls=k + 1, draft_state=draft.state,
                                           categorical=categorical)

    def _block_speculation(self, graphdef, draft, k, draft_name):
        """``speculation`` with a block run's drafts: one block of k <= b positions in one call a round."""
        b = nnx.merge(draft.graphdef, *draft.state).block_size
        if k > b:
            raise ValueError(f"draft_k={k}: a block drafter drafts at most its block size {b} tokens a round")
        if draft.graph.dim - 1 != self.config.vocab_size:
            raise ValueError(f"the draft run's vocabulary ({draft.graph.dim - 1} tokens) differs from this run's "
                             f"({self.config.vocab_size})")

        def parts(temperature, top_p):
            t_prefill, target = ar.build_speculative_target(graphdef, temperature, top_p)
            d_prefill, drafter = block.speculative_drafter(draft.graphdef, draft.graph, draft.noise,
                                                           temperature=temperature, top_p=top_p)
            return (lambda state, prompt: (t_prefill(state[0], prompt), d_prefill(state[1], prompt))), target, drafter

        return sampling.rounds.Speculation(parts, k, draft_name or "block", draft_calls=1, draft_state=draft.state,
                                           categorical=self.config.sampling.categorical)

    def network(self, seed=0):
        """Inputs V + 1 ids (BOS = V), outputs the V next-token logits, causal attention, no time input."""
        v = self.config.vocab_size
        return network_of(self.config, seed, num_tokens=v + 1, out_dim=v, scale_by_sigma=False, causal=True,
                        time_conditioning=False, normalize=False)

    def loss(self, key, model, x0, train, rngs=None):
        """-sum_l log p(x0^l | x0^{<l}), the exact NLL (``sedd.ar.sequence_nll``; training.loss_chunk)."""
        return ar.sequence_nll(model, x0, deterministic=not train, rngs=rngs, chunk=self.config.training.loss_chunk)

    def likelihood(self, key, net, batches, num_t, *, max_batches=None, chars_per_token=None, progress=False,
                   **kwargs):
        """The exact NLL of ``sedd.evaluate.dataset_nll`` (num_t and key unused: nothing is estimated)."""
        model = net.model
        return evaluate.dataset_nll(lambda x0: ar.nll(model, x0), batches, max_batches=max_batches,
                                    chars_per_token=chars_per_token, progress=progress)

    def sample(self, key, net, num_samples, steps=None, predictor=None, rows=None, **options):
        """L ancestral steps with the KV cache (``sedd.ar.sample``); steps and predictor do not apply.

        With draft: speculative sampling (``sedd.ar.speculative_sample``), the
        same law in fewer calls of this network: draft="ngram" (prompt
        lookup) or a ``Net`` of a smaller AR network; draft_k drafts a round
        (default 4); temperature and top_p on this network's law; verification
        "block" (default) or "token" (``sedd.speculative.round_law``). A prompt
        (fixed_mask / fixed_tokens) is a prefix of the same length in every row.

        Raises:
          ValueError: an option other than categorical, temperature,
            return_stats and a prefix (and, with draft, draft_k, top_p and verification), or
            a prompt that is not a prefix.
        """
        categorical = options.pop("categorical", self.config.sampling.categorical)
        temperature = options.pop("temperature", 1.0)
        return_stats = options.pop("return_stats", False)
        length = self.config.data.seq_len
        if options.get("draft") is not None:
            return self._speculative(key, net, num_samples, length, return_stats, temperature, **options)
        options.pop("draft", None)
        prompt = prefix_prompt(options.pop("fixed_mask", None), options.pop("fixed_tokens", None))
        if options:
            raise ValueError(f"the AR baseline takes no sampler options {sorted(options)}")
        tokens = ar.sample(key, net.model, num_samples, length, temperature=temperature, prompt=prompt,
                           categorical=categorical)
        stats = None
        if return_stats:  # one network call a position, each on one position of every row
            stats = {"nfe": jnp.int32(length), "nfe_per_sample": jnp.full((num_samples,), length, jnp.int32)}
        return sampling.Samples(tokens, None, stats)

    def _speculative(self, key, net, num_samples, length, return_stats, temperature, *, draft, draft_k=4,
                     top_p=1.0, fixed_mask=None, fixed_tokens=None, verification="block"):
        """``sample`` with draft: speculative sampling, the prompt a prefix of the same length in every row."""
        prompt = prefix_prompt(fixed_mask, fixed_tokens)
        if not (isinstance(draft_k, int) and 1 <= draft_k <= length):
            raise ValueError(f"draft_k must be an integer in [1, {length}], got {draft_k!r}")
        drafter = (draft.graphdef, draft.state) if isinstance(draft, Net) else draft
        tokens, stats = ar.speculative_sample(key, net.graphdef, net.state, num_samples, length, draft_k, drafter,
                                              temperature=temperature, top_p=top_p, prompt=prompt,
                                              verification=verification)
        return sampling.Samples(tokens, None, stats if return_stats else None)

    def drafter(self, net):
        """Drafts left to right, k + 1 calls a round (``sedd.ar.speculative_drafter``)."""
        return net
