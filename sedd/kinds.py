r"""Model kinds: what a run's network is, and how it is trained, scored and sampled.

``get(config)`` reads ``config.model.kind``, the one place in sedd that does,
and returns the kind's object; training, evaluation, serving and the CLI ask
that object and never which kind they hold (md4's ``get_model`` is the
pattern: each model class owns its loss and its sampling step).

  "ddit"  SEDD (Lou et al. 2024): the DDiT over graph.dim ids with adaLN time
          conditioning; the denoising score entropy loss; the likelihood
          bound; every sampler of ``sedd.sampling``.
  "ar"    the autoregressive baseline (``sedd.ar``): the same DDiT, causal,
          without a time input; the next-token NLL, exact; ancestral
          sampling with a KV cache.
  "block" block diffusion (``sedd.block``; BD3-LM, Arriola et al. 2025): SEDD
          inside blocks of model.block_size tokens, autoregressive across
          them; the sum of the blocks' bounds; block-by-block sampling with
          a KV cache of the clean blocks, text of any length.
  "spec"  self-speculation (``sedd.spec``; TiDAR-style): one network with a
          causal half (the next-token NLL, exact) and a draft half that
          drafts model.block_size tokens in one step; each call verifies the
          last draft and drafts the next, the causal half's law exactly.

A new kind is one subclass of ``Kind`` registered with ``@register(name)``.
What it owns:

  network(seed)                        the DDiT of the config's sizes
  loss(key, model, x0, train, rngs)    the training objective, nats per sequence, float32[B]
  check_sampler(name)                  refuse, before training, a sampler it cannot use
  check_options(sampler, **options)    refuse options (temperature, top_p, ...) it cannot honour
  likelihood(key, net, batches, ...)   its figure on a split: a bound, or an exact NLL
  sample(key, net, num_samples, ...)   its sampler entry point, a ``sedd.sampling.Samples``
  rows_program(graphdef, ...)          what ``sedd serve`` runs: a ``sedd.sampling.rows.RowsProgram``
  speculation(graphdef, draft, k)      what ``sedd serve`` runs instead for a model that writes left to right
                                       with drafts: a ``sedd.sampling.rounds.Speculation`` (or None)
  unwritten_id()                       the id a position not yet drawn holds on the host (streaming)
  settles(sampler)                     whether an unmasked position keeps its token (text can stream)
  noise_groups(model, train, rngs)     the network over groups of positions sharing a noise level, for
                                       ``sedd.distill`` (the sequence for SEDD, the blocks for block diffusion)

and what it can do: ``exact`` (its likelihood is the exact NLL, so it can
judge samples), ``serves`` (``sedd serve`` streams its denoising),
``speculates`` (it drafts and verifies in one network: ``sedd serve``
decodes it by rounds without a --draft, through ``speculative_parts``) and
``conditions`` (the prompt patterns it honours: prefix, suffix, infill).
Whether a sampler runs on a graph is decided by ``sedd.sampling.check_graph``
alone; a kind adds only what is its own.

The builders of the forward process (``build_graph``, ``build_noise``) and of
the network (``build_model``) live here too, so training and inference build
the same objects from the same config. ``net`` below is a network split by
``nnx.split(model, nnx.Param, ...)``: a ``Net(graphdef, params, rest)``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from sedd import ar, block, evaluate, graphs, losses, sampling, spec, speculative
from sedd import sharding as sharding_lib
from sedd import noise as noise_lib
from sedd.kernels import compute_dtype
from sedd.model import DDiT

KINDS: dict[str, type[Kind]] = {}
"""model.kind -> its ``Kind`` subclass; fill it with ``register``."""


def register(name: str) -> Callable:
    """Decorator of a ``Kind`` subclass: make it ``model.kind = name``."""

    def add(cls):
        if name in KINDS:
            raise ValueError(f"model kind {name!r} is already registered")
        cls.name = name
        KINDS[name] = cls
        return cls

    return add


def get(config) -> Kind:
    """The kind of ``config.model.kind``, built for this config (config.vocab_size filled in).

    Raises:
      ValueError: an unknown kind, naming the registered ones.
    """
    name = config.model.kind
    if name not in KINDS:
        raise ValueError(f"unknown model.kind {name!r}; expected one of {', '.join(repr(k) for k in KINDS)}")
    return KINDS[name](config)


def build_graph(config) -> graphs.Graph:
    """The forward graph of ``config.graph.type`` over config.vocab_size tokens."""
    return graphs.get_graph(config.graph.type, config.vocab_size)


def build_noise(config):
    """The noise schedule of ``config.noise``: LogLinear(eps) or Geometric(sigma_min, sigma_max)."""
    n = config.noise
    kwargs = {"loglinear": {"eps": n.eps}, "geometric": {"sigma_min": n.sigma_min, "sigma_max": n.sigma_max}}
    return noise_lib.get_noise(n.type, **kwargs.get(n.type, {}))


def build_model(config, seed: int = 0) -> DDiT:
    """The network of ``config.model`` (its kind's ``network``) for config.vocab_size tokens."""
    return get(config).network(seed)


class Net(NamedTuple):
    """A network split by ``nnx.split(model, nnx.Param, ...)``: structure, parameters, the rest (RNG state)."""

    graphdef: Any
    params: Any
    rest: Any

    @property
    def state(self) -> tuple:
        """(params, rest): what ``params_score_fn(graphdef)`` takes as its first argument."""
        return self.params, self.rest

    @property
    def model(self) -> DDiT:
        """The merged network."""
        return nnx.merge(self.graphdef, self.params, self.rest)


@functools.lru_cache(maxsize=None)
def params_score_fn(graphdef, rows: jax.sharding.Sharding | None = None):
    """(state, x, sigma) -> log-score of the network `graphdef`, dropout off; state = (params, rest).

    One function object per network structure (and row placement):
    ``sedd.sampling.sample`` and ``sedd.evaluate.likelihood_bound`` compile
    once per score function and take the weights as traced ``score_params``,
    so new weights never recompile. With `rows` (a sharding of the (B, L)
    input) the rows stay split over the mesh's data axis at every call, so
    each device computes its own rows; without it, with weights replicated
    over several devices, every device would compute every row.
    """
    if rows is None:
        return lambda state, x, sigma: nnx.merge(graphdef, *state)(x, sigma, deterministic=True)

    def score(state, x, sigma):
        with sharding_lib.split_rows(rows):  # the activations' rows too, at every block (an fsdp mesh)
            return nnx.merge(graphdef, *state)(jax.lax.with_sharding_constraint(x, rows), sigma, deterministic=True)

    return score


def _network(config, seed: int, **arch) -> DDiT:
    """The DDiT of config.model's sizes, with the kind's inputs, outputs and attention in `arch`."""
    m = config.model
    return DDiT(hidden_size=m.hidden_size, n_blocks=m.n_blocks, n_heads=m.n_heads, cond_dim=m.cond_dim,
                mlp_ratio=m.mlp_ratio, dropout=m.dropout, max_len=config.data.seq_len,
                dtype=compute_dtype(m.dtype), vocab_multiple=m.vocab_multiple, remat=m.remat,
                rngs=nnx.Rngs(params=seed, dropout=seed + 1), **arch)


def chunked_entropy(model: DDiT, graph: graphs.Graph, chunk: int, **net) -> Callable:
    r"""(x_t, sigma, x0) -> float32[B, L]: the network's score entropy at x_t, `chunk` positions at a time.

    ``graph.score_entropy(model(x_t, sigma), sigma, x_t, x0)`` without the
    [B, L, D] log-score: the blocks run once over all L positions, then the
    final layer, the log-score and its score entropy run on chunks of
    positions, each chunk's output computed again for the gradient
    (``DDiT.output_rows``). Every form of ``DDiT.log_score`` (scale_by_sigma,
    normalize, a time-independent network) and both graphs reduce position by
    position, which is all the chunks need. net: dropout arguments of the network.
    """

    def entropy(x_t, sigma, x0):
        h, c = model.features(x_t, sigma, **net)  # (B, L, H), (B, C)

        def fn(out, x, x0):  # (B, Lc, D), (B, Lc), (B, Lc) -> (B, Lc)
            return graph.score_entropy(model.log_score(out, x, sigma), sigma[:, None], x, x0)

        return model.output_rows(h, c, fn, x_t, x0, chunk=chunk)  # (B, L)

    return entropy


class Kind:
    """A kind of model: its network, loss, likelihood figure and sampler (see the module docstring).

    Attributes:
      name: its model.kind.
      exact: its likelihood figure is the exact NLL (it can judge samples).
      serves: ``sedd serve`` can serve it (``rows_program``).
      speculates: it drafts and verifies itself (``speculative_parts``), so ``sedd serve`` decodes it by
        speculative rounds (``speculation``) without a drafter of its own.
      conditions: the prompt patterns it honours, of "prefix", "suffix", "infill".
      diffuses: it samples by denoising steps (``sedd.sampling``'s samplers, ``steps``).
      config: the run's config.
    """

    name: ClassVar[str]
    exact: ClassVar[bool] = False
    serves: ClassVar[bool] = False
    speculates: ClassVar[bool] = False
    conditions: ClassVar[tuple[str, ...]] = ("prefix", "suffix", "infill")
    diffuses: ClassVar[bool] = False

    def __init__(self, config):
        self.config = config

    @property
    def label(self) -> str:
        """A short name for tables and plots: the kind and its one size ("block b=4", "spec k=4", "ar")."""
        return self.name

    def one_token_steps(self, length: int) -> int | None:
        """The sampler steps that write one token a step over `length` positions (None: it takes no steps)."""
        return None

    def network(self, seed: int = 0) -> DDiT:
        """The network of the config, initialised from `seed`."""
        raise NotImplementedError

    def loss(self, key: jax.Array, model: DDiT, x0: jax.Array, train: bool, rngs=None) -> jax.Array:
        """The training objective of x0 int32[B, L]: float32[B] nats per sequence (dropout from rngs when train)."""
        raise NotImplementedError

    def check_sampler(self, name: str) -> None:
        """Raise a ValueError, before any training, when config.sampling.predictor = name cannot sample the run.

        Raises:
          sedd.sampling.UnknownSampler: a name that is not registered.
        """
        if name not in sampling.PREDICTORS:
            raise sampling.UnknownSampler(f"unknown sampling.predictor {name!r}; expected one of "
                                          f"{sorted(sampling.PREDICTORS)}")

    def check_options(self, sampler: str, **options) -> None:
        """Raise a ValueError when `sampler` cannot run on this kind with these options (temperature, top_p, ...)."""
        self.check_sampler(sampler)

    def settles(self, sampler: str) -> bool:
        """Whether a position, once unmasked by `sampler`, keeps its token to the end (text can be sent early)."""
        return False

    def describe(self) -> dict:
        """What ``sedd serve``'s model list says of the kind: {"kind": name, "block_size": b or None}."""
        return {"kind": self.name, "block_size": None}

    def rows_program(self, graphdef, *, steps: int, sampler: str, trajectory: bool,
                     live: bool) -> sampling.rows.RowsProgram:
        """The batched program ``sedd serve`` runs (``sedd.sampling.rows``): each row alone, its T and top_p traced.

        Args:
          graphdef: the network's structure (its weights are the program's first argument).
          steps, sampler: the sampler and its steps.
          trajectory: also return the frames along the way; live: hand the states to the host at each call.
        """
        raise NotImplementedError(f"model.kind={self.name!r} is not served")

    def speculation(self, graphdef, draft=None, k: int | None = None,
                    draft_name: str | None = None) -> sampling.rounds.Speculation | None:
        """How ``sedd serve`` decodes this kind by speculative rounds; None: by ``rows_program``.

        The base: a kind that ``speculates`` drafts for itself (k its model.block_size unless given,
        ``speculative_parts``); any other takes no draft.

        Args:
          graphdef: the network's structure.
          draft: None, "ngram" or a ``Net`` of a smaller AR network (an AR run's drafter).
          k: drafts a round (None: the kind's default).
          draft_name: what the server reports as the draft (a run's name).
        Raises:
          ValueError: a draft or a k this kind cannot take, in one line.
        """
        if draft is not None:
            raise ValueError(f"a draft (--draft) drafts for an AR run (model.kind='ar'); this run's model.kind is "
                             f"{self.name!r}" + (", which drafts for itself" if self.speculates else ""))
        if not self.speculates:
            if k is not None:
                raise ValueError(f"draft_k applies to speculative decoding; this run's model.kind {self.name!r} "
                                 "does not speculate")
            return None
        if k is not None and k != self.config.model.block_size:
            raise ValueError(f"draft_k={k!r}: this run drafts model.block_size={self.config.model.block_size} "
                             "tokens a round, what it was trained to draft")
        k = self.config.model.block_size
        return sampling.rounds.Speculation(functools.partial(self.speculative_parts, graphdef), k, "self",
                                           categorical=self.config.sampling.categorical, shared=True)

    def speculative_parts(self, graphdef, temperature, top_p) -> tuple:
        """(prefill, target, drafter) of a kind that ``speculates`` (``sedd.sampling.rounds.Speculation.parts``).

        temperature and top_p may be traced float32[] values; prefill(state, prompt int32[B, P]) ->
        (target_state, drafter_state), target and drafter as ``sedd.speculative.decode`` takes them.
        """
        raise NotImplementedError(f"model.kind={self.name!r} does not draft for itself")

    def unwritten_id(self) -> int | None:
        """The id the host holds at a position not yet drawn (shown as a mask); None: every position holds a token."""
        return None

    def likelihood(self, key: jax.Array, net: Net, batches, num_t: int, *, max_batches=None,
                   chars_per_token=None, progress: bool = False, **kwargs) -> dict:
        """The figures of ``sedd.evaluate.dataset_bound`` (or its exact counterpart) on batches of a split."""
        raise NotImplementedError

    def noise_groups(self, model: DDiT, train: bool = False, rngs=None) -> tuple[int, Callable]:
        """(b, fn): the network as positions in groups of b that share a noise level (``sedd.sdtt``'s distillation).

        fn(x_t int32[B, L], x0 int32[B, L], sigma float[B, L / b]) -> log-score float32[B, L, D]; dropout from
        rngs when train.

        Raises:
          ValueError: a kind without denoising steps to distill.
        """
        raise ValueError(f"model.kind={self.name!r} has no denoising steps to distill (sedd distill takes a "
                         "SEDD or block-diffusion run of the absorbing graph)")

    def drafter(self, net: Net) -> Any:
        """The network as the draft of an AR run's speculative sampling (``sedd.ar.speculative_sample``'s draft).

        Raises:
          ValueError: a kind that cannot draft.
        """
        raise ValueError(f"a model.kind={self.name!r} run cannot draft for speculative sampling: the drafts come "
                         "from 'ngram', an AR run (left to right) or a block-diffusion run (one block in one step)")

    def sample(self, key: jax.Array, net: Net, num_samples: int, steps: int | None = None,
               predictor: str | None = None, rows: jax.sharding.Sharding | None = None,
               **options) -> sampling.Samples:
        """num_samples sequences; the config's sampling section gives the defaults; rows: their placement."""
        raise NotImplementedError


@register("ddit")
class Diffusion(Kind):
    """SEDD: a DDiT log-score network over the forward graph's ids, trained by score entropy.

    Attributes:
      graph, noise: the forward process of the config.
    """

    serves = True
    diffuses = True

    def __init__(self, config):
        super().__init__(config)
        self.graph = build_graph(config)
        self.noise = build_noise(config)

    def one_token_steps(self, length):
        return length

    def network(self, seed: int = 0, **arch) -> DDiT:
        """Inputs and outputs range over graph.dim ids (V + 1 with the absorbing graph's MASK, V for uniform).

        arch: more DDiT arguments (a subclass's attention).

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
                "p(x0 | unmasked) times the analytic factor 1 / (e^sigma - 1) that scale_by_sigma applies (RADD)")
        if m.normalize and not (absorbing_scaled or g.type == "uniform"):
            raise ValueError(
                "model.normalize=True needs graph.type='absorbing' with model.scale_by_sigma=True, or "
                f"graph.type='uniform' (got graph.type={g.type!r}, scale_by_sigma={m.scale_by_sigma}): the "
                "normalized output is p(x0 | x_t), turned into the absorbing score by the factor "
                "1 / (e^sigma - 1) (MDLM's SUBS) or into the uniform one by the forward kernel (DUO); "
                "--config.model.normalize=False gives SEDD's unnormalized score, which needs neither")
        dim = self.graph.dim
        return _network(self.config, seed, num_tokens=dim, out_dim=dim, scale_by_sigma=absorbing_scaled,
                        causal=False, time_conditioning=m.time_conditioning, normalize=m.normalize, **arch)

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
        net = dict(deterministic=not train, rngs=rngs)
        entropy = chunked_entropy(model, self.graph, t.loss_chunk, **net) if t.loss_chunk else None
        return losses.loss_fn(key, lambda x, sigma: model(x, sigma, **net), self.graph, self.noise, x0,
                              sampling_eps=t.sampling_eps, low_discrepancy=t.low_discrepancy,
                              t_power=t.t_power if train else 0.0, entropy_fn=entropy)

    def noise_groups(self, model, train=False, rngs=None):
        """One group, the whole sequence, at the row's sigma: fn(x_t, x0, sigma[B, 1]) = model(x_t, sigma[:, 0])."""
        net = dict(deterministic=not train, rngs=rngs)
        return self.config.data.seq_len, lambda x_t, x0, sigma: model(x_t, sigma[:, 0], **net)

    def check_sampler(self, name):
        super().check_sampler(name)
        try:
            sampling.check_graph(name, self.graph)
        except ValueError:
            supported = sampling.PREDICTORS[name].graphs
            raise ValueError(f"sampling.predictor={name!r} runs on the {' and '.join(supported)} graph, and "
                             f"graph.type={self.config.graph.type!r}: add --config.sampling.predictor=analytic "
                             "(or euler)") from None

    def check_options(self, sampler, **options):
        """``sedd.sampling.Options.checked``: the sampler on this graph with these options; and the cache's rule."""
        self._check_cache(options)
        sampling.Options.make(**options).checked(sampler, self.graph)

    def _check_cache(self, options: dict) -> None:
        """cache=True is exact only for a model without a time input: refuse it otherwise."""
        if options.get("cache") and self.config.model.time_conditioning:
            raise ValueError("cache=True reuses the network output across noise levels, which is exact only "
                             "for a model without a time input; this run has model.time_conditioning=True "
                             "(train with --config.model.time_conditioning=False for a cacheable model)")

    def settles(self, sampler):
        """On the absorbing graph every sampler but one that masks decoded tokens again; never on the uniform."""
        return self.graph.absorb and sampling.get_sampler(sampler).settles

    def unwritten_id(self):
        """The absorbing graph's MASK; None on the uniform graph (every position holds a token at every step)."""
        return self.graph.mask if self.graph.absorb else None

    def rows_program(self, graphdef, *, steps, sampler, trajectory, live):
        s = self.config.sampling
        return sampling.rows.full_sequence_program(
            params_score_fn(graphdef), self.graph, self.noise, steps=steps, predictor=sampler, eps=float(s.eps),
            categorical=s.categorical, trajectory=trajectory, live=live)

    def likelihood(self, key, net, batches, num_t, *, max_batches=None, chars_per_token=None, progress=False,
                   **kwargs):
        """The score-entropy bound of ``sedd.evaluate.dataset_bound``, with its standard error."""
        return evaluate.dataset_bound(key, params_score_fn(net.graphdef), self.graph, self.noise, batches, num_t,
                                      max_batches=max_batches, chars_per_token=chars_per_token,
                                      score_params=net.state, progress=progress, **kwargs)

    def sample(self, key, net, num_samples, steps=None, predictor=None, rows=None, **options):
        """``sedd.sampling.sample`` (``sample_long`` with max_length / block_length) on this network.

        Raises:
          ValueError: cache=True with a time-conditioned model (the cache is
            exact only for model.time_conditioning=False, where the network
            does not see sigma); an option the sampler cannot honour.
        """
        s = self.config.sampling
        self._check_cache(options)
        options.setdefault("categorical", s.categorical)
        args = dict(predictor=predictor or s.predictor, eps=s.eps, score_params=net.state, **options)
        shape = (num_samples, self.config.data.seq_len)
        steps = s.steps if steps is None else steps
        score_fn = params_score_fn(net.graphdef, rows)
        if {"max_length", "block_length", "stop_id"} & set(options):
            long = {k: args.pop(k, None) for k in ("max_length", "block_length")}
            long["max_length"] = long["max_length"] or shape[1]
            return sampling.sample_long(key, score_fn, self.graph, self.noise, shape, steps, **long, **args)
        return sampling.sample(key, score_fn, self.graph, self.noise, shape, steps, **args)


def _prefix_prompt(fixed_mask, fixed_tokens) -> jax.Array | None:
    """int32[B, P]: the prompt of an AR run, a prefix of the same length P in every row (None: no prompt)."""
    if fixed_mask is None:
        return None
    mask = jnp.asarray(fixed_mask, bool)
    p = int(mask[0].sum())
    if not bool(jnp.all(mask == (jnp.arange(mask.shape[1]) < p)[None, :])):
        raise ValueError("the AR baseline takes a prompt that is a prefix of the same length in every row "
                         "(no suffix or infill)")
    return jnp.asarray(fixed_tokens, jnp.int32)[:, :p]


def _draft_k(k, length: int) -> int:
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
            k = _draft_k(4 if k is None else k, length)
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
        return _network(self.config, seed, num_tokens=v + 1, out_dim=v, scale_by_sigma=False, causal=True,
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
        prompt = _prefix_prompt(options.pop("fixed_mask", None), options.pop("fixed_tokens", None))
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
        prompt = _prefix_prompt(fixed_mask, fixed_tokens)
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
        return _network(self.config, seed, num_tokens=v + 2, out_dim=v, scale_by_sigma=False, causal=False,
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
        prompt = _prefix_prompt(options.pop("fixed_mask", None), options.pop("fixed_tokens", None))
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
