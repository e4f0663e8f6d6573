"""Self-speculation as a kind (``sedd.spec``, TiDAR-style): one network drafts and verifies in the same call."""

from __future__ import annotations

from sedd import evaluate, sampling, spec
from sedd.kinds.base import Kind, network_of, prefix_prompt, register


@register("spec")
class SelfSpeculative(Kind):
    """One network that drafts and verifies in the same call (``sedd.spec``, TiDAR-style).

    Its likelihood is its causal half's exact NLL, and its samples have that
    half's law exactly (speculative sampling of its own drafts).

    Attributes:
      block_size: k = model.block_size, the drafts a round.
    """

    exact = True
    speculates = True
    conditions = ("prefix",)

    def __init__(self, config):
        super().__init__(config)
        k, length = config.model.block_size, config.data.seq_len
        if not (isinstance(k, int) and 1 <= k <= length):
            raise ValueError(f"model.block_size={k!r} (the drafts a round of model.kind='spec') must be an "
                             f"integer in [1, data.seq_len={length}]; 4 is a good start")
        if config.training.loss_chunk:
            raise ValueError(f"training.loss_chunk={config.training.loss_chunk} is not implemented for "
                             "model.kind='spec': set it to 0")
        w = config.training.draft_weight
        if not (isinstance(w, (int, float)) and 0 <= w < float("inf")):
            raise ValueError(f"training.draft_weight={w!r} must be a finite number >= 0 "
                             "(the drafts' share of the loss)")
        self.block_size, self.draft_weight = k, float(w)

    @property
    def label(self):
        return f"spec k={self.block_size}"

    def describe(self):
        return {"kind": self.name, "block_size": self.block_size}

    def speculative_parts(self, graphdef, temperature, top_p):
        """``sedd.spec.speculative_parts`` for ``sedd serve``: one state shared by target and drafter."""
        prefill, target, drafter = spec.speculative_parts(graphdef, self.block_size, temperature, top_p)
        return (lambda state, text: (prefill(state, text), None)), target, drafter

    def network(self, seed=0):
        """Inputs V + 2 ids (BOS = V, MASK = V + 1), V logits out, no time input; attention by mask."""
        v = self.config.vocab_size
        return network_of(self.config, seed, num_tokens=v + 2, out_dim=v, scale_by_sigma=False, causal=False,
                        time_conditioning=False, normalize=False)

    def loss(self, key, model, x0, train, rngs=None):
        """(3) of ``sedd.spec``: the causal half's NLL plus the one-step drafts' cross-entropy."""
        return spec.loss(model, x0, self.block_size, deterministic=not train, rngs=rngs,
                         draft_weight=self.draft_weight)

    def likelihood(self, key, net, batches, num_t, *, max_batches=None, chars_per_token=None, progress=False,
                   **kwargs):
        """The causal half's exact NLL (``sedd.evaluate.dataset_nll``; num_t and key unused)."""
        model = net.model
        return evaluate.dataset_nll(lambda x0: spec.nll(model, x0), batches, max_batches=max_batches,
                                    chars_per_token=chars_per_token, progress=progress)

    def sample(self, key, net, num_samples, steps=None, predictor=None, rows=None, **options):
        """Self-speculation (``sedd.spec.sample``): the causal half's law, up to k + 1 tokens a call.

        steps, predictor and rows do not apply. Options: temperature, top_p,
        categorical, verification ("block" or "token", ``sedd.speculative.round_law``),
        draft_temperature (tau of the drafts' law q^(1/tau), default ``sedd.spec.DRAFT_TEMPERATURE``),
        return_stats and a prompt that is a prefix of the same length in every row.

        Raises:
          ValueError: any other option (a draft: this run drafts for itself).
        """
        categorical = options.pop("categorical", self.config.sampling.categorical)
        temperature = options.pop("temperature", 1.0)
        top_p = options.pop("top_p", 1.0)
        verification = options.pop("verification", "block")
        draft_temperature = options.pop("draft_temperature", spec.DRAFT_TEMPERATURE)
        return_stats = options.pop("return_stats", False)
        prompt = prefix_prompt(options.pop("fixed_mask", None), options.pop("fixed_tokens", None))
        if options.pop("draft", None) is not None:
            raise ValueError("a model.kind='spec' run drafts for itself; it takes no draft")
        options.pop("draft_k", None)
        if options:
            raise ValueError(f"a model.kind='spec' run takes no sampler options {sorted(options)}")
        tokens, stats = spec.sample(key, net.graphdef, net.state, num_samples, self.config.data.seq_len,
                                    self.block_size, temperature=temperature, top_p=top_p, prompt=prompt,
                                    categorical=categorical, verification=verification,
                                    draft_temperature=draft_temperature)
        return sampling.Samples(tokens, None, stats if return_stats else None)
