"""Block diffusion as a kind (``sedd.block``; BD3-LM, Arriola et al. 2025): SEDD inside blocks, AR across them."""

from __future__ import annotations

from sedd import block, evaluate
from sedd.kinds.ddit import Diffusion
from sedd.kinds.base import register


@register("block")
class BlockDiffusion(Diffusion):
    """Block diffusion (``sedd.block``): the DDiT over [x_t ; x_0] with block-causal attention.

    Attributes:
      block_size: b = model.block_size, dividing data.seq_len.
    """

    serves = True
    conditions = ("prefix",)  # a prompt before the text only: the model never saw text after a block

    def __init__(self, config):
        super().__init__(config)
        b, length = config.model.block_size, config.data.seq_len
        if not (isinstance(b, int) and 1 <= b <= length and length % b == 0):
            raise ValueError(f"model.block_size={b!r} must be a positive divisor of data.seq_len={length} "
                             "(b = 1: autoregressive over single-token blocks; b = seq_len: SEDD)")
        if config.training.loss_chunk:
            raise ValueError(f"training.loss_chunk={config.training.loss_chunk} is not implemented for "
                             "model.kind='block' (its noise levels differ from block to block): set it to 0")
        if not self.graph.absorb:
            raise ValueError(f"model.kind='block' needs graph.type='absorbing' (got {config.graph.type!r}): "
                             "each block is drawn from all-MASK given the clean blocks before it")
        self.block_size = b

    @property
    def label(self):
        return f"block b={self.block_size}"

    def one_token_steps(self, length):
        """Steps a block (``sedd.block.sample`` takes its steps per block)."""
        return self.block_size

    def describe(self):
        return {"kind": self.name, "block_size": self.block_size}

    def rows_program(self, graphdef, *, steps, sampler, trajectory, live):
        s = self.config.sampling
        return block.rows_program(graphdef, self.graph, self.noise, block_size=self.block_size, steps=steps,
                                  predictor=sampler, eps=float(s.eps), categorical=s.categorical,
                                  trajectory=trajectory, live=live)

    def noise_groups(self, model, train=False, rngs=None):
        """The blocks, each at its own sigma and given x0's blocks before it (``sedd.block.log_score``)."""
        return self.block_size, lambda x_t, x0, sigma: block.log_score(
            model, x_t, x0, sigma, self.block_size, deterministic=not train, rngs=rngs)

    def network(self, seed=0):
        """SEDD's network whose blocks decode b positions at a time against the clean blocks' cache."""
        return super().network(seed, block_size=self.block_size)

    def drafter(self, net):
        """Drafts one block of k <= b positions in one call (``sedd.block.speculative_drafter``)."""
        return block.BlockDraft(net.graphdef, net.state, self.graph, self.noise)

    def loss(self, key, model, x0, train, rngs=None):
        r"""Eq. (2) of ``sedd.block``: each block's score entropy at its own t, given the clean blocks before it."""
        t = self.config.training
        block_fn = lambda x_t, x, sigma: block.log_score(  # noqa: E731
            model, x_t, x, sigma, self.block_size, deterministic=not train, rngs=rngs)
        return block.loss_per_position(key, block_fn, self.graph, self.noise, x0, sampling_eps=t.sampling_eps,
                                       low_discrepancy=t.low_discrepancy, t_power=t.t_power if train else 0.0,
                                       block_size=self.block_size).sum(-1)

    def likelihood(self, key, net, batches, num_t, *, max_batches=None, chars_per_token=None, progress=False,
                   **kwargs):
        """The sum of the blocks' bounds, Eq. (2) of ``sedd.block``, with its standard error.

        The clean text's keys and values are computed once a batch and each
        t point runs the noisy text against them (``sedd.block.bound_fns``).
        """
        fns = block.bound_fns(net.graphdef, self.block_size)
        return evaluate.dataset_bound(key, fns.block_fn, self.graph, self.noise, batches, num_t,
                                      max_batches=max_batches, chars_per_token=chars_per_token,
                                      score_params=net.state, progress=progress, prepare=fns.prepare,
                                      per_position=block.per_position_fn(self.block_size), **kwargs)

    def sample(self, key, net, num_samples, steps=None, predictor=None, rows=None, **options):
        """``sedd.block.sample``: block by block with the KV cache; max_length tokens (default data.seq_len).

        steps are per block. rows is not used: the rows stay where the
        weights are.

        Raises:
          ValueError: block_length (a block model's blocks are model.block_size),
            cache=True with a time-conditioned model, a suffix or infill
            pattern, an option the sampler cannot honour.
        """
        s = self.config.sampling
        if options.get("block_length") is not None:
            raise ValueError(f"block_length is for a SEDD run's windows; this block model draws blocks of "
                             f"model.block_size={self.block_size}")
        options.pop("block_length", None)
        self._check_cache(options)
        options.setdefault("categorical", s.categorical)
        length = options.pop("max_length", None) or self.config.data.seq_len
        scorer = block.network_scorer(net.graphdef, self.config.data.seq_len)
        return block.sample(key, scorer, net.state, self.graph, self.noise, (num_samples, length), self.block_size,
                            s.steps if steps is None else steps, predictor or s.predictor, eps=s.eps, **options)
