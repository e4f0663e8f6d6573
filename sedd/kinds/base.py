"""The protocol of a model kind, its registry, and the builders every kind shares.

``Kind`` is what a run's kind owns (see ``sedd.kinds``); ``register`` fills
``KINDS``; ``get`` reads ``config.model.kind``, the one place in sedd that does.
``build_graph``, ``build_noise`` and ``build_model`` build the forward process
and the network from a config, the same for training and inference; ``Net`` is
a network split by ``nnx.split(model, nnx.Param, ...)``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from sedd import graphs, sampling, speculative
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


def network_of(config, seed: int, **arch) -> DDiT:
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

    def check_given(self, *, steps=None, sampler=None, suffix: bool = False, infill: bool = False) -> None:
        """Refuse an option given that this kind cannot honour, in one line naming it and the kinds that take it.

        ``Run.sample`` (so ``sedd sample``) and ``sedd serve`` ask it alike; None or False: not given.
        (A draft and draft_k are the drafter's to check, ``speculation``.)
        """
        if not self.diffuses:
            for name, value in (("steps", steps), ("sampler", sampler)):
                if value is not None:
                    raise ValueError(f"{name}={value!r}: a model.kind={self.name!r} run writes left to right, with "
                                     f"no denoising steps; {name} is for {kinds_that(lambda k: k.diffuses)}")
        for name, what, given in (("suffix", "a suffix", suffix), ("infill", "an infill template", infill)):
            if given and name not in self.conditions:
                raise ValueError(f"{what}: a model.kind={self.name!r} run writes after a prompt only; {what} "
                                 f"is for {kinds_that(lambda k: name in k.conditions)}")

    def prefix_prompt(self, fixed_mask, fixed_tokens) -> jax.Array | None:
        """int32[B, P]: a prompt of a kind that writes left to right, a prefix of the same P in every row (None).

        Raises:
          ValueError: any other pattern (a suffix or an infill template), naming the kinds that honour one.
        """
        if fixed_mask is None:
            return None
        mask = jnp.asarray(fixed_mask, bool)
        p = int(mask[0].sum())
        if not bool(jnp.all(mask == (jnp.arange(mask.shape[1]) < p)[None, :])):
            raise ValueError(f"a model.kind={self.name!r} run takes a prompt that is a prefix of the same length in "
                             f"every row; a suffix or infill is for {kinds_that(lambda k: 'infill' in k.conditions)}")
        return jnp.asarray(fixed_tokens, jnp.int32)[:, :p]

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

        The base: a kind that ``speculates`` drafts for itself (k its model.draft_k unless given,
        ``speculative_parts``); any other takes no draft.

        Args:
          graphdef: the network's structure.
          draft: None, "ngram" or a ``sedd.drafts.Drafter`` of another run (``drafter``).
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
                raise ValueError(f"draft_k={k!r}: a model.kind={self.name!r} run does not decode speculatively; "
                                 "draft_k is for an AR run with a draft (model.kind='ar') or a model.kind='spec' run")
            return None
        if k is not None and k != self.draft_k:
            raise ValueError(f"draft_k={k!r}: this run drafts model.draft_k={self.draft_k} "
                             "tokens a round, what it was trained to draft")
        k = self.draft_k
        return sampling.rounds.Speculation(functools.partial(self.speculative_parts, graphdef), k, "self",
                                           categorical=self.config.sampling.categorical, shared=True)

    def choose_layout(self, net: Net, choice="auto", workdir=None, batch: int = 1, progress: bool = False) -> str:
        """Set the layout of this kind's speculative rounds (a kind that ``speculates``); returns a line saying
        which. Raises a ValueError for any other kind."""
        raise ValueError(f"layout={choice!r}: a round's layout is for a run that drafts for itself "
                         f"(model.kind='spec'); this run's model.kind is {self.name!r}")

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
        """The network as the draft of an AR run's speculative sampling (a ``sedd.drafts.Drafter``).

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



def kinds_that(has: Callable[[type[Kind]], bool]) -> str:
    """The registered kinds of which `has` holds, as a message names them: "model.kind 'ddit' or 'block'"."""
    names = [repr(name) for name, cls in KINDS.items() if has(cls)]
    return "model.kind " + " or ".join(names)


@dataclasses.dataclass(frozen=True)
class LeftToRight:
    """The sampling options of a kind that writes left to right (AR, spec), as one checked value.

    ``make`` is the one validation of them, as ``sedd.sampling.Options.checked``
    is the diffusion kinds'. A field a kind does not take is refused there.

    Attributes:
      categorical: the method of ``sedd.categorical.sample_categorical``.
      temperature: >= 0 on the network's law (0: argmax where the decoder allows it).
      top_p: in (0, 1], its nucleus.
      return_stats: count the network calls.
      prompt: int32[B, P] the given prefix, the same P in every row; None.
      draft: None, "ngram" or a ``sedd.drafts.Drafter`` (an AR run's speculative sampling).
      draft_k: drafts a round (None: the default of the decoder).
      verification: "block" or "token" (``sedd.speculative.round_law``).
      draft_temperature: tau of a spec run's drafts (None: its default).
      layout: a spec run's round layout (``sedd.kinds.spec.layout_of``: "K,GROUPS", "auto"; None: its default).
    """

    categorical: str = "precise"
    temperature: float = 1.0
    top_p: float = 1.0
    return_stats: bool = False
    prompt: Any = dataclasses.field(default=None, compare=False)
    draft: Any = None
    draft_k: Any = None
    verification: str = "block"
    draft_temperature: Any = None
    layout: Any = None

    @classmethod
    def make(cls, kind: Kind, takes: tuple[str, ...], **options) -> LeftToRight:
        """The options of ``kind.sample`` checked; `takes` the fields besides categorical, temperature,
        return_stats and a prompt (fixed_mask / fixed_tokens) that this kind honours.

        Raises:
          ValueError: an option this kind does not take, or a value out of its range, in one line.
        """
        prompt = kind.prefix_prompt(options.pop("fixed_mask", None), options.pop("fixed_tokens", None))
        given = {name for name, value in options.items() if value is not None}
        unknown = sorted(given - set(takes) - {"categorical", "temperature", "return_stats"})
        if unknown:
            raise ValueError(f"a model.kind={kind.name!r} run takes no option {', '.join(unknown)}; it takes "
                             f"{', '.join(sorted({'temperature', 'categorical', *takes}))}")
        values = cls(**{name: options[name] for name in given}, prompt=prompt)
        t, p = values.temperature, values.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf"):
            raise ValueError(f"temperature must be a number >= 0, got {t!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        if values.categorical not in sampling.CATEGORICAL_METHODS:
            raise ValueError(f"unknown categorical method {values.categorical!r}; expected one of "
                             f"{sampling.CATEGORICAL_METHODS}")
        if values.verification not in speculative.VERIFICATIONS:
            raise ValueError(f"verification must be one of {speculative.VERIFICATIONS}, got {values.verification!r}")
        tau = values.draft_temperature
        if tau is not None and (isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 0):
            raise ValueError(f"draft_temperature must be a number > 0, got {tau!r}")
        return dataclasses.replace(values, temperature=float(t), top_p=float(p))


class WritesLeftToRight(Kind):
    """A kind that writes its text left to right (the AR baseline, self-speculation): exact, a prefix prompt,
    every token kept once written, its options one ``LeftToRight`` value.

    Attributes:
      takes: the options of ``sample`` besides categorical, temperature, return_stats and a prompt.
    """

    exact = True
    conditions = ("prefix",)  # it writes after a prompt only
    takes: ClassVar[tuple[str, ...]] = ()

    def unwritten_id(self):
        """V, the BOS id: never a token of the text (a position not written yet)."""
        return self.config.vocab_size

    def settles(self, sampler):
        """Always: each token written stays."""
        return True

    def options(self, **options) -> LeftToRight:
        """The options of ``sample`` as one checked value (``LeftToRight.make``; categorical: the config's)."""
        options.setdefault("categorical", self.config.sampling.categorical)
        return LeftToRight.make(self, self.takes, **options)

    def check_options(self, sampler, **options):
        """``options``: the options ``sample`` takes, checked (a sampler does not apply)."""
        self.options(**options)
