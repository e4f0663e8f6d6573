r"""Reverse-time sampling: samplers (a registry), the final denoiser, conditioning.

Sampling runs the forward chain backwards from its limit law on a time grid,
one sampler step at a time, the conditioning re-imposed after each step,
then removes the noise left (Sec. 4 of Lou et al. 2024), in one compiled
program (``run_loop``); a sampler may carry state across steps. Samplers are
registered by name in ``SAMPLERS``, each with its equation above its step
and the graphs and options it honours (an option it cannot honour is a
ValueError, never ignored): "euler" and "analytic" (SEDD's tau-leaping and
Tweedie samplers), and on the absorbing graph "first_hitting", "confidence",
"dilated", "entropy_bound", "left_to_right" and "remdm"; docs/sampling.md ranks them. Every
draw counts its network evaluations (NFE, ``Samples.stats``).

The package, one concept a module: ``loop`` (``run_loop``, ``Options``,
``Samples``, the time grid and conditioning, ``sample``: the full-sequence
driver), ``context`` (what a step sees: network calls and NFE, the cache,
temperature and nucleus, static or traced), ``samplers`` (the registry,
``check_graph``, euler, analytic, the corrector), ``absorbing``
(first_hitting, confidence, dilated, entropy_bound, remdm), ``long``
(windows over text longer than the model), ``lanes`` (the rows of a served batch,
each with its own key, temperature and top_p in one batched program),
``rounds`` (the same for speculative decoding), ``prompts`` (text prompts as
fixed positions). ``sedd.kinds.block`` drives the same loop a block at a
time. A new sampler is a ``Sampler`` subclass registered with
``register_sampler`` (a stateless one a function with
``register_sampler``), traceable code only.

Shapes: B batch, L length, D = graph.dim, V = graph.vocab_size, N steps.
"""

from sedd.categorical import METHODS as CATEGORICAL_METHODS
from sedd.sampling.context import Context, entropy, nucleus, shaped_law
from sedd.sampling.samplers import (
    GENERIC_OPTIONS,
    SAMPLERS,
    Analytic,
    Euler,
    FunctionSampler,
    Sampler,
    UnknownSampler,
    check_graph,
    corrector_step,
    get_sampler,
    register_sampler,
)
from sedd.sampling.absorbing import (
    PLANNED_ORDERS,
    AbsorbingSampler,
    Confidence,
    LeftToRight,
    Dilated,
    EntropyBound,
    FirstHitting,
    ReMDM,
    planned_rank,
)
from sedd.sampling.loop import (
    FINALS,
    Options,
    Samples,
    check_int,
    check_shape,
    conditioning,
    denoise_step,
    one_step,
    options_from,
    run_loop,
    sample,
    start_carry,
    time_grid,
)
from sedd.sampling.long import sample_long
from sedd.sampling.prompts import MASK_CHAR, check_length, text_conditioning
from sedd.sampling import lanes, rounds

__all__ = [
    "CATEGORICAL_METHODS",
    "Context",
    "entropy",
    "nucleus",
    "shaped_law",
    "GENERIC_OPTIONS",
    "SAMPLERS",
    "Analytic",
    "Euler",
    "FunctionSampler",
    "Sampler",
    "UnknownSampler",
    "check_graph",
    "corrector_step",
    "get_sampler",
    "register_sampler",
    "AbsorbingSampler",
    "Confidence",
    "LeftToRight",
    "EntropyBound",
    "FirstHitting",
    "ReMDM",
    "Dilated",
    "PLANNED_ORDERS",
    "planned_rank",
    "FINALS",
    "Options",
    "Samples",
    "check_int",
    "check_shape",
    "conditioning",
    "denoise_step",
    "one_step",
    "options_from",
    "run_loop",
    "sample",
    "start_carry",
    "time_grid",
    "sample_long",
    "MASK_CHAR",
    "check_length",
    "text_conditioning",
    "lanes",
    "rounds",
]
