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
import below registers it). What it owns:

  network(seed)                        the DDiT of the config's sizes
  loss(key, model, x0, train, rngs)    the training objective, nats per sequence, float32[B]
  check_sampler(name)                  refuse, before training, a sampler it cannot use
  check_options(sampler, **options)    refuse options (temperature, top_p, ...) it cannot honour: one checked
                                       value, ``sedd.sampling.Options`` or ``LeftToRight``
  check_given(steps, sampler, ...)     refuse, in one line naming the kinds that take it, an option given
                                       that it cannot honour (``sedd sample`` and ``sedd serve`` alike)
  likelihood(key, net, batches, ...)   its figure on a split: a bound, or an exact NLL
  sample(key, net, num_samples, ...)   its sampler entry point, a ``sedd.sampling.Samples``
  rows_program(graphdef, ...)          what ``sedd serve`` runs: a ``sedd.sampling.rows.RowsProgram``
  speculation(graphdef, draft, k)      what ``sedd serve`` runs instead for a model that writes left to right
                                       with drafts: a ``sedd.sampling.rounds.Speculation`` (or None)
  unwritten_id()                       the id a position not yet drawn holds on the host (so that streamed
                                       text adds up to the answer)
  drafter(net)                         its network as a ``sedd.drafts.Drafter`` for an AR run, or a refusal
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
the network (``build_model``) live in ``base`` too, so training and inference build
the same objects from the same config. ``net`` below is a network split by
``nnx.split(model, nnx.Param, ...)``: a ``Net(graphdef, params, rest)``.
"""

from sedd.kinds.base import (KINDS, Kind, LeftToRight, Net, WritesLeftToRight, build_graph, build_model, build_noise,
                             chunked_entropy, get, network_of, params_score_fn, register)
from sedd.kinds.ddit import Diffusion
from sedd.kinds.ar import Autoregressive
from sedd.kinds.block import BlockDiffusion
from sedd.kinds.spec import SelfSpeculative

__all__ = ["KINDS", "Autoregressive", "BlockDiffusion", "Diffusion", "Kind", "LeftToRight", "Net", "SelfSpeculative",
           "WritesLeftToRight", "build_graph", "build_model", "build_noise", "chunked_entropy", "get", "network_of", "params_score_fn",
           "register"]
