r"""Model kinds: what a run's network is, and how it is trained, scored and sampled.

``get(config)`` reads ``config.model.kind``, the one place in sedd that does,
and returns the kind's object; training, evaluation, serving and the CLI ask
that object and never which kind they hold (md4's ``get_model`` is the
pattern: each model class owns its loss and its sampling step).

  "ddit"  SEDD (Lou et al. 2024): the DDiT over graph.dim ids with adaLN time
          conditioning; the denoising score entropy loss; the likelihood
          bound; every sampler of ``sedd.sampling``.
  "ar"    the autoregressive baseline (``sedd.kinds.ar``): the same DDiT, causal,
          without a time input; the next-token NLL, exact; ancestral
          sampling with a KV cache.
  "block" block diffusion (``sedd.kinds.block``; BD3-LM, Arriola et al. 2025): SEDD
          inside blocks of model.block_size tokens, autoregressive across
          them; the sum of the blocks' bounds; block-by-block sampling with
          a KV cache of the clean blocks, text of any length.
  "spec"  self-speculation (``sedd.kinds.spec``; TiDAR-style): one network with a
          causal half (the next-token NLL, exact) and a draft half that
          drafts model.draft_k tokens in one step; each call verifies the
          last draft and drafts the next, the causal half's law exactly.

A new kind is one module of this package holding everything it knows, and
in it one subclass of ``Kind`` registered with ``@register(name)`` (its
import below registers it). What every kind is (``base.Kind``):

  network(seed)                        the DDiT of the config's sizes
  loss(key, model, x0, train, rngs)    the training objective, nats per sequence, float32[B]
  likelihood(key, net, batches, ...)   its figure on a split: a bound, or an exact NLL
  sample(key, net, num_samples, ...)   its sampler entry point, a ``sedd.sampling.Samples``
  describe()                           what ``sedd serve``'s model list says of it
  check_sampler / check_options /      refuse, before any work and in one line naming the kinds that take it,
    check_given                        a sampler, an option or a value it cannot honour
  settles(sampler), unwritten_id()     whether text can stream as it is written, and what a position not yet
                                       written holds on the host

with ``exact`` (its likelihood is the exact NLL), ``conditions`` (the prompt
patterns it honours) and ``diffuses`` (it takes sampler steps). What only some
kinds can do is a capability of ``sedd.kinds.capabilities`` that the kind's
module gives its class (``ServesRows``, ``Speculates``, ``Drafts``,
``Distills``, ``Tunes``); the CLI and the server ask for the capability, never
for a kind. The kinds that hold a causal language model (AR, spec) share
``sedd.kinds.causal``: its NLL, decoding and ``CausalKind``.

The builders of the forward process (``build_graph``, ``build_noise``) and of
the network (``build_model``) live in ``base`` too, so training and inference build
the same objects from the same config. ``net`` below is a network split by
``nnx.split(model, nnx.Param, ...)``: a ``Net(graphdef, params, rest)``.
"""

from sedd.kinds.base import (KINDS, Kind, Net, abstract_network, build_graph, build_model, build_noise,
                             chunked_entropy, get, network_of, params_score_fn, register)
from sedd.kinds import capabilities
from sedd.kinds.ddit import Diffusion
from sedd.kinds.ar import Autoregressive
from sedd.kinds.block import BlockDiffusion
from sedd.kinds.spec import SelfSpeculative

__all__ = ["KINDS", "Autoregressive", "BlockDiffusion", "Diffusion", "Kind", "Net", "SelfSpeculative",
           "abstract_network", "build_graph", "build_model", "build_noise", "capabilities", "chunked_entropy", "get", "network_of",
           "params_score_fn", "register"]
