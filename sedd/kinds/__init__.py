r"""Model kinds: what a run's network is, and how it is trained, scored and sampled.

``get(config)`` reads ``config.model.kind``, the one place in sedd that does,
and returns the kind's object; training, evaluation, serving and the CLI ask
that object and never which kind they hold (md4's ``get_model`` is the
pattern: each model class owns its loss and its sampling step).

  "ddit"  SEDD (Lou et al. 2024): the score entropy loss, the bound, every sampler.
  "ar"    the autoregressive baseline (``sedd.kinds.ar``), with model.draft_head
          a draft head of its own (``sedd.kinds.draft_head``).
  "block" block diffusion (``sedd.kinds.block``; BD3-LM, Arriola et al. 2025).
  "spec"  self-speculation (``sedd.kinds.spec``; TiDAR-style).

A new kind is one module of this package holding everything it knows, and
in it one subclass of ``Kind`` (``base``: what every kind is) registered with
``@register(name)``; its import below registers it. What only some kinds can
do (diffusing, an exact likelihood, serving, speculating, drafting, distilling,
tuning a layout: ``layouts``) is a capability of ``capabilities``, each member
a caller may read declared there, that the kind's class derives from;
the kinds that hold a causal language model share ``causal``
(docs/architecture.md, "Where a new thing goes").
"""

from sedd.kinds.base import (
    KINDS,
    Kind,
    Net,
    abstract_network,
    build_graph,
    build_model,
    build_noise,
    check_config,
    chunked_entropy,
    get,
    network_of,
    params_score_fn,
    register,
)
from sedd.kinds import capabilities
from sedd.kinds.ddit import Diffusion
from sedd.kinds.ar import Autoregressive
from sedd.kinds.block import BlockDiffusion
from sedd.kinds.spec import SelfSpeculative

__all__ = [
    "KINDS",
    "Autoregressive",
    "BlockDiffusion",
    "Diffusion",
    "Kind",
    "Net",
    "SelfSpeculative",
    "abstract_network",
    "build_graph",
    "build_model",
    "build_noise",
    "capabilities",
    "check_config",
    "chunked_entropy",
    "get",
    "network_of",
    "params_score_fn",
    "register",
]
