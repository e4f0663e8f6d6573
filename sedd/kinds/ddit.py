"""SEDD (Lou et al. 2024): the DDiT over graph.dim ids, the denoising score entropy, every sampler of sampling."""

from __future__ import annotations

from sedd import evaluate, losses, sampling
from sedd.kinds.base import Kind, build_graph, build_noise, chunked_entropy, network_of, params_score_fn, register
from sedd.kinds.capabilities import Diffuses, Distills, ServesLanes, refuse_drafts
from sedd.model import DDiT


@register("ddit")
class Diffusion(Kind, Diffuses, ServesLanes, Distills):
    """SEDD: a DDiT log-score network over the forward graph's ids, trained by score entropy.

    Attributes:
      graph, noise: the forward process of the config.
    """

    def __init__(self, config):
        super().__init__(config)
        self.graph = build_graph(config)
        self.noise = build_noise(config)

    def one_token_steps(self, length: int) -> int:
        """The sampler steps that write one token a step over `length` positions."""
        return length

    def network(self, seed: int = 0, **arch) -> DDiT:
        """Inputs and outputs range over graph.dim ids (V + 1 with the absorbing graph's MASK, V for uniform).

        arch: more DDiT arguments (a subclass's attention, or its num_tokens: a block network that reads the
          token before each position embeds a BOS too).

        Raises:
          ValueError: model.time_conditioning=False or model.normalize=True
            without the absorbing graph's scale_by_sigma, where neither is defined.
        """
        m, g = self.config.model, self.config.graph
        absorbing_scaled = g.type == "absorbing" and m.scale_by_sigma
        if not m.time_conditioning and not absorbing_scaled:
            raise ValueError(
                "model.time_conditioning=False needs graph.type='absorbing' and model.scale_by_sigma=True (got "
                f"graph.type={g.type!r}, scale_by_sigma={m.scale_by_sigma}): only there is the score "
                "p(x0 | unmasked) times the analytic factor 1 / (e^sigma - 1) that scale_by_sigma applies (RADD)"
            )
        if m.normalize and not (absorbing_scaled or g.type == "uniform"):
            raise ValueError(
                "model.normalize=True needs graph.type='absorbing' with model.scale_by_sigma=True, or "
                f"graph.type='uniform' (got graph.type={g.type!r}, scale_by_sigma={m.scale_by_sigma}): the "
                "normalized output is p(x0 | x_t), turned into the absorbing score by the factor "
                "1 / (e^sigma - 1) (MDLM's SUBS) or into the uniform one by the forward kernel (DUO); "
                "--config.model.normalize=False gives SEDD's unnormalized score, which needs neither"
            )
        dim = self.graph.dim
        return network_of(
            self.config,
            seed,
            num_tokens=arch.pop("num_tokens", dim),
            out_dim=dim,
            scale_by_sigma=absorbing_scaled,
            causal=False,
            time_conditioning=m.time_conditioning,
            normalize=m.normalize,
            **arch,
        )

    def loss(self, key, model, x0, train, rngs=None):
        r"""Eq. (9) of Lou et al. 2024 (denoising score entropy), one Monte Carlo draw of t per sequence.

            L(x0) = \sigma'(t) \sum_l \sum_{y \ne x_t^l} Q(y, x_t^l)
                    ( s(x_t, t)_{l,y} - r_y \log s(x_t, t)_{l,y} + K(r_y) ),
            t ~ U[\epsilon, 1],  x_t ~ p_{\bar\sigma(t)}(. | x0),
            r_y = p_{\bar\sigma(t)}(y | x0^l) / p_{\bar\sigma(t)}(x_t^l | x0^l),

        an upper bound on -log p(x0) in expectation (Thm. 3.6) up to the prior
        term. With training.t_power = p > 0 a training step draws t from
        q(t) ~ t^{-p} and weights L by U(t) / q(t) (the same expectation, a
        gradient of less variance; ``sedd.losses.sample_times``); the
        validation estimate (train=False) keeps the uniform draw.
        """
        t = self.config.training
        dropout = dict(deterministic=not train, rngs=rngs)
        entropy = chunked_entropy(model, self.graph, t.loss_chunk, **dropout) if t.loss_chunk else None
        return losses.loss_fn(
            key,
            lambda x, sigma: model(x, sigma, **dropout),
            self.graph,
            self.noise,
            x0,
            sampling_eps=t.sampling_eps,
            low_discrepancy=t.low_discrepancy,
            t_power=t.t_power if train else 0.0,
            entropy_fn=entropy,
        )

    def noise_groups(self, model, train=False, rngs=None):
        """One group, the whole sequence, at the row's sigma: fn(x_t, x0, sigma[B, 1]) = model(x_t, sigma[:, 0])."""
        dropout = dict(deterministic=not train, rngs=rngs)
        return self.config.data.seq_len, lambda x_t, x0, sigma: model(x_t, sigma[:, 0], **dropout)

    def check_sampler(self, name):
        super().check_sampler(name)
        try:
            sampling.check_graph(name, self.graph)
        except ValueError:
            supported = sampling.SAMPLERS[name].graphs
            raise ValueError(
                f"sampling.sampler={name!r} runs on the {' and '.join(supported)} graph, and "
                f"graph.type={self.config.graph.type!r}: add --config.sampling.sampler=analytic "
                "(or euler)"
            ) from None

    def check_options(self, sampler, **options):
        """``sedd.sampling.Options.checked``: the sampler on this graph with these options; and the cache's rule."""
        self._check_cache(options)
        sampling.Options.make(**options).checked(sampler, self.graph)

    def _check_cache(self, options: dict) -> None:
        """cache=True is exact only for a model without a time input: refuse it otherwise."""
        if options.get("cache") and self.config.model.time_conditioning:
            raise ValueError(
                "cache=True reuses the network output across noise levels, which is exact only "
                "for a model without a time input; this run has model.time_conditioning=True "
                "(train with --config.model.time_conditioning=False for a cacheable model)"
            )

    def settles(self, sampler):
        """On the absorbing graph every sampler but one that masks decoded tokens again; never on the uniform."""
        return self.graph.absorb and sampling.get_sampler(sampler).settles

    def unwritten_id(self):
        """The absorbing graph's MASK; None on the uniform graph (every position holds a token at every step)."""
        return self.graph.mask if self.graph.absorb else None

    def lane_program(self, graphdef, *, steps, sampler, trajectory, live):
        s = self.config.sampling
        static = dict(steps=steps, sampler=sampler, eps=float(s.eps), categorical=s.categorical)
        return self._lane_program(graphdef, trajectory=trajectory, live=live, **static)

    def _lane_program(self, graphdef, **static):
        """``lane_program`` with the config's eps and categorical in `static`: the program of the whole sequence."""
        return sampling.lanes.full_sequence_program(params_score_fn(graphdef), self.graph, self.noise, **static)

    def likelihood(self, key, net, batches, num_t, **options):
        """The score-entropy bound of ``sedd.evaluate.dataset_bound`` (`options` its own), with its standard error."""
        fn = params_score_fn(net.graphdef)
        return evaluate.dataset_bound(
            key, fn, self.graph, self.noise, batches, num_t, score_params=net.state, **options
        )

    def sample(self, key, net, num_samples, steps=None, sampler=None, **options):
        """``sedd.sampling.sample`` (``sample_long`` with max_length / block_length) on this network.

        Raises:
          ValueError: cache=True with a time-conditioned model (the cache is
            exact only for model.time_conditioning=False, where the network
            does not see sigma); an option the sampler cannot honour.
        """
        refuse_drafts(self, options)
        s = self.config.sampling
        self._check_cache(options)
        options.setdefault("categorical", s.categorical)
        args = dict(sampler=sampler or s.sampler, eps=s.eps, score_params=net.state, **options)
        shape = (num_samples, self.config.data.seq_len)
        steps = s.steps if steps is None else steps
        score_fn = params_score_fn(net.graphdef, net.placement)
        if {"max_length", "block_length", "stop_id"} & set(options):
            long = {k: args.pop(k, None) for k in ("max_length", "block_length")}
            long["max_length"] = long["max_length"] or shape[1]
            return sampling.sample_long(key, score_fn, self.graph, self.noise, shape, steps, **long, **args)
        return sampling.sample(key, score_fn, self.graph, self.noise, shape, steps, **args)
