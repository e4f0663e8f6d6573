"""The protocol of a model kind, its registry, and the builders every kind shares.

``Kind`` is what every kind is (see ``sedd.kinds``): its network, its loss,
its likelihood, its sampling and its description, and the checks of its
options. What only some kinds can do is a capability
(``sedd.kinds.capabilities``), which the kind's own module gives it.
``register`` fills ``KINDS``; ``get`` reads ``config.model.kind``, the one
place in sedd that does. ``build_graph``, ``build_noise`` and ``build_model``
build the forward process and the network from a config, the same for
training and inference; ``Net`` is a network split by
``nnx.split(model, nnx.Param, ...)``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from sedd import categorical, graphs, sampling
from sedd import config as config_lib
from sedd import sharding as sharding_lib
from sedd import noise as noise_lib
from sedd.kernels import compute_dtype
from sedd.model import DDiT, check_remat

KINDS: dict[str, type[Kind]] = {}
"""model.kind -> its ``Kind`` subclass; fill it with ``register``."""


def register(name: str, reads: tuple[str, ...] = ()) -> Callable:
    """Decorator of a ``Kind`` subclass: make it ``model.kind = name``, reading the keys `reads` of ``OWN_KEYS``."""

    def add(cls):
        if name in KINDS:
            raise ValueError(f"model kind {name!r} is already registered")
        cls.name, cls.reads = name, tuple(reads)
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
    """A network split by ``nnx.split(model, nnx.Param, ...)``: structure, parameters, the rest (RNG state), and
    where the rows of its inputs go: split over a mesh's batch axes (``Run.sample``), None: where the weights are."""

    graphdef: Any
    params: Any
    rest: Any
    placement: jax.sharding.Sharding | None = None

    @property
    def state(self) -> tuple:
        """(params, rest): what ``params_score_fn(graphdef)`` takes as its first argument."""
        return self.params, self.rest

    @property
    def model(self) -> DDiT:
        """The merged network."""
        return nnx.merge(self.graphdef, self.params, self.rest)


@functools.lru_cache(maxsize=None)
def params_score_fn(graphdef, placement: jax.sharding.Sharding | None = None):
    """(state, x, sigma) -> log-score of the network `graphdef`, dropout off; state = (params, rest).

    One function object per network structure (and row placement):
    ``sedd.sampling.sample`` and ``sedd.evaluate.likelihood_bound`` compile
    once per score function and take the weights as traced ``score_params``,
    so new weights never recompile. With `placement` (a sharding of the (B, L)
    input, ``Net.placement``) the rows stay split over the mesh's data axis at
    every call, so each device computes its own rows; without it, with weights
    replicated over several devices, every device would compute every row.
    """
    if placement is None:
        return lambda state, x, sigma: nnx.merge(graphdef, *state)(x, sigma, deterministic=True)

    def score(state, x, sigma):
        with sharding_lib.split_rows(placement):  # the activations' rows too, at every layer (an fsdp mesh)
            x = jax.lax.with_sharding_constraint(x, placement)
            return nnx.merge(graphdef, *state)(x, sigma, deterministic=True)

    return score


def abstract_network(kind: Kind, seed: int = 0) -> tuple:
    """(graphdef, abstract params, rest) of the kind's network, without computing its weights.

    `rest` (the dropout RNG state) is concrete; the parameters are
    ``jax.ShapeDtypeStruct``s, to restore into or to initialise in their shards.
    """
    graphdef, abstract, _ = nnx.split(nnx.eval_shape(lambda: kind.network(seed)), nnx.Param, ...)
    rest = jax.jit(lambda: nnx.split(kind.network(seed), nnx.Param, ...)[2])()
    return graphdef, abstract, rest


def network_of(config, seed: int, **arch) -> DDiT:
    """The DDiT of config.model's sizes, with the kind's inputs, outputs and attention in `arch`."""
    m = config.model
    return DDiT(
        hidden_size=m.hidden_size,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        cond_dim=m.cond_dim,
        mlp_ratio=m.mlp_ratio,
        dropout=m.dropout,
        max_len=config.data.seq_len,
        dtype=compute_dtype(m.dtype),
        vocab_multiple=m.vocab_multiple,
        remat=m.remat,
        rngs=nnx.Rngs(params=seed, dropout=seed + 1),
        **arch,
    )


def chunked_entropy(model: DDiT, graph: graphs.Graph, chunk: int, **dropout) -> Callable:
    r"""(x_t, sigma, x0) -> float32[B, L]: the network's score entropy at x_t, `chunk` positions at a time.

    ``graph.score_entropy(model(x_t, sigma), sigma, x_t, x0)`` without the
    [B, L, D] log-score: the layers run once over all L positions, then the
    final layer, the log-score and its score entropy run on chunks of
    positions, each chunk's output computed again for the gradient
    (``DDiT.output_chunked``). Every form of ``DDiT.log_score`` (scale_by_sigma,
    normalize, a time-independent network) and both graphs reduce position by
    position, which is all the chunks need. dropout: the network's deterministic and rngs.
    """

    def entropy(x_t, sigma, x0):
        h, c = model.features(x_t, sigma, **dropout)  # (B, L, H), (B, C)

        def fn(out, x, x0):  # (B, Lc, D), (B, Lc), (B, Lc) -> (B, Lc)
            return graph.score_entropy(model.log_score(out, x, sigma), sigma[:, None], x, x0)

        return model.output_chunked(h, c, fn, x_t, x0, chunk=chunk)  # (B, L)

    return entropy


def transfer(params, source, what: str, adapt: Callable | None = None, fresh: str | None = None):
    """`params` with each array replaced by `source`'s at the same path (arrays only `source` has are left out).

    adapt(path, ours, theirs) -> array gives an array whose shape differs (None: refused); an array whose path
    holds `fresh` and that `source` lacks keeps its initial value (a module this network adds); `what` names the
    source.
    """
    theirs = {jax.tree_util.keystr(p): a for p, a in jax.tree_util.tree_flatten_with_path(source)[0]}

    def take(path, ours):
        name = jax.tree_util.keystr(path)
        if name not in theirs and fresh is not None and fresh in name:
            return ours
        if name not in theirs:
            raise ValueError(f"training.init_from: the {what} run has no {name} (this network's {ours.shape})")
        if theirs[name].shape == ours.shape:
            return jnp.asarray(theirs[name], ours.dtype)
        out = adapt(name, ours, theirs[name]) if adapt else None
        if out is None:
            raise ValueError(
                f"training.init_from: {name} is {theirs[name].shape} in the {what} run and {ours.shape} here; "
                "start from a run of this kind and size"
            )
        return out

    return jax.tree_util.tree_map_with_path(take, params)


class Kind:
    """A kind of model: its network, loss, likelihood figure and sampler (see the module docstring).

    Attributes:
      name: its model.kind.
      conditions: the prompt patterns it honours, of "prefix", "suffix", "infill".
      config: the run's config.
    """

    name: ClassVar[str]
    reads: ClassVar[tuple[str, ...]] = ()
    """The keys of ``OWN_KEYS`` the kind reads (``register``); a config setting another is refused (``check_config``)."""
    conditions: ClassVar[tuple[str, ...]] = ("prefix", "suffix", "infill")

    def __init__(self, config):
        self.config = config

    @property
    def label(self) -> str:
        """A short name for tables and plots: the kind and its one size ("block b=4", "spec k=4", "ar")."""
        return self.name

    def describe(self) -> dict:
        """What ``sedd serve``'s model list says of the kind: {"kind": name} and its own sizes."""
        return {"kind": self.name}

    def network(self, seed: int = 0) -> DDiT:
        """The network of the config, initialised from `seed`."""
        raise NotImplementedError

    def loss(self, key: jax.Array, model: DDiT, x0: jax.Array, train: bool, rngs=None) -> jax.Array:
        """The training objective of x0 int32[B, L]: float32[B] nats per sequence (dropout from rngs when train)."""
        raise NotImplementedError

    def params_from(self, source, params):
        """`params` (this kind's network's ``nnx.State``) with every array taken from `source`'s (a loaded
        ``sedd.runs.Run``: training.init_from), a run of this kind and sizes. Raises a ValueError naming the
        first array of this network the source lacks or holds in another shape."""
        return transfer(params, source.params, str(source.config.model.kind))

    def likelihood(
        self,
        key: jax.Array,
        net: Net,
        batches,
        num_t: int,
        *,
        max_batches=None,
        chars_per_token=None,
        progress: bool = False,
        **kwargs,
    ) -> dict:
        """The figures of ``sedd.evaluate.dataset_bound`` (or its exact counterpart) on batches of a split."""
        raise NotImplementedError

    def sample(
        self,
        key: jax.Array,
        net: Net,
        num_samples: int,
        steps: int | None = None,
        sampler: str | None = None,
        **options,
    ) -> sampling.Samples:
        """num_samples sequences (on ``net.placement`` where the kind places rows); the config's sampling section
        gives the defaults."""
        raise NotImplementedError

    def check_sampler(self, name: str) -> None:
        """Raise a ValueError, before any training, when config.sampling.sampler = name cannot sample the run.

        Raises:
          sedd.sampling.UnknownSampler: a name that is not registered.
        """
        if name not in sampling.SAMPLERS:
            raise sampling.UnknownSampler(
                f"unknown sampling.sampler {name!r}; expected one of {sorted(sampling.SAMPLERS)}"
            )

    def check_options(self, sampler: str, **options) -> None:
        """Raise a ValueError when ``sample`` cannot run `sampler` on this kind with these options (temperature,
        top_p, the kind's own, ...): the same refusals as ``sample``, before any work."""
        self.check_sampler(sampler)

    def settles(self, sampler: str) -> bool:
        """Whether a position, once unmasked by `sampler`, keeps its token to the end (text can be sent early)."""
        return False

    def unwritten_id(self) -> int | None:
        """The id the host holds at a position not yet drawn (shown as a mask); None: every position holds a token."""
        return None


OWN_KEYS = (
    "model.block_size",
    "model.token_shift",
    "model.draft_k",
    "model.draft_head",
    "training.draft_weight",
    "training.draft_target",
)
"""The config keys that only some kinds read; each kind declares those it reads (``Kind.reads``)."""


def check_config(config) -> None:
    """What a config about to be trained asks of its kind and network, before any work (``sedd.runs.check_config``).

    Each name-valued key by the check that reads it where it is used: model.kind and what the kind checks as it
    is built (graph.type and noise.type of a diffusion run, its own keys), sampling.sampler, sampling.categorical
    (refused only after training and saving before), model.dtype, model.remat. Then ``OWN_KEYS``: a key the
    kind does not read (``Kind.reads``) given a value other than the shipped default's is refused
    (`--config.model.draft_head=8` on a SEDD run trained a SEDD run without a word).

    Raises:
      ValueError: the first name not of its registry, or the key, the kind and the kinds that read it; one line.
    """
    get(config).check_sampler(config.sampling.sampler)
    categorical.check_method(config.sampling.categorical)
    compute_dtype(config.model.dtype)
    check_remat(config.model.remat)
    cls = KINDS[config.model.kind]
    default = config_lib.load_config(config_lib.DEFAULT_CONFIG)
    for key in OWN_KEYS:
        value, usual = (functools.reduce(getattr, key.split("."), c) for c in (config, default))
        if key not in cls.reads and value != usual:
            raise ValueError(
                f"{key}={value!r}: a model.kind={cls.name!r} run does not read it (it is for "
                f"{kinds_that(lambda k: key in k.reads)}); leave it at {usual!r}"
            )


def kinds_that(has: Callable[[type[Kind]], bool]) -> str:
    """The registered kinds of which `has` holds, as a message names them: "model.kind 'ddit' or 'block'"."""
    names = [repr(name) for name, cls in KINDS.items() if has(cls)]
    return "model.kind " + " or ".join(names)
