r"""Reverse-time sampling: samplers (a registry), the final denoiser, conditioning.

Sampling runs the forward chain backwards from its limit law on a time grid,
one sampler step at a time, with the conditioning re-imposed after each step,
then removes the noise left (Sec. 4 of Lou et al. 2024): ``loop.py`` writes
the loop out; it is one compiled program (``run_loop``), and a sampler may
carry state across steps (its own times, the cached network output).

Samplers, registered by name in ``PREDICTORS`` (the math is in each class):

  "euler"          tau-leaping with the reverse rate, Eq. (4) of Lou et al.
  "analytic"       Tweedie tau-leaping, Thm. 4.2 of Lou et al.
  "first_hitting"  (absorbing) the exact reverse chain event by event: the
                   next unmasking time, then one position and its token
                   (Zheng et al. 2024, arXiv 2409.02908).
  "confidence"     (absorbing) unmask ceil(masked / steps left) positions a
                   step, the most confident first (MaskGIT; LLaDA's
                   low_confidence); order="random" is any-order AR sampling.
  "dilated"        (absorbing) the same count a step in an order planned by
                   position: far-apart positions together (dilated, bit-
                   reversed; or order="strided"), the order `sedd distill
                   --config.distill.order=dilated` distils.
  "entropy_bound"  (absorbing) the lowest-entropy positions while their
                   summed entropy minus the largest stays under max_entropy
                   (EB-sampler, Ben-Hamu et al. 2025, arXiv 2505.24857).
  "remdm"          (absorbing) MDLM's posterior plus remasking of decoded
                   tokens (ReMDM, Wang et al. 2025, arXiv 2503.00307).

Options every sampler reads (an option a sampler or graph cannot honour is a
ValueError, never ignored):

  temperature, top_p   on the denoiser p(x0_l = . | x_t) at masked positions
                       (absorbing graph), keeping the step's unmasking mass;
                       temperature 0 takes the argmax.
  corrector_steps      forward-backward corrector steps after each step
                       (Campbell et al. 2022, arXiv 2205.14987); euler/analytic.
  cache                skip the network when no token changed since its last
                       call, rescaling the cached output analytically
                       (MDLM's ddpm_cache; exact for a time-independent
                       absorbing model, RADD, Ou et al. 2024).

Every draw counts its network evaluations (NFE): a step whose network call
can be skipped (nothing masked, or nothing changed under ``cache``) costs
none. ``sample(..., return_stats=True)`` returns them in ``Samples.stats``.

The package, one concept a module:

  loop.py        the core: ``run_loop`` (the compiled loop over any score
                 function), ``Options``, ``Samples``, the time grid and
                 conditioning checks, ``sample`` (its full-sequence driver)
  context.py     ``Context``: what a step sees (network calls and NFE, the
                 cache, temperature and nucleus, static or traced)
  samplers.py    the registry (``PREDICTORS``, ``check_graph``), euler,
                 analytic, the corrector
  absorbing.py   first_hitting, confidence, dilated, entropy_bound, remdm
  long.py        ``sample_long``: windows over text longer than the model
  rows.py        one key, temperature and top_p per row in one batched
                 program, and the states handed to a listener while it
                 runs: what ``sedd serve`` runs, through the kinds
  rounds.py      the same for speculative decoding: each row its own rounds
                 of drafts checked by the target, handed to the host as they land
  prompts.py     ``text_conditioning``: text prompts as fixed positions; ``check_length`` before encoding

Other drivers of the same loop: ``sedd.kinds.block`` (one block at a time against a
KV cache). A new sampler is a ``Sampler`` subclass in its own module (or in
``absorbing.py``), imported below.

Adding a stateless predictor is one function and the decorator::

    @register_predictor("my_predictor")
    def my_predictor(key, score_fn, graph, noise, x, t, dt, categorical):
        sigma, dsigma = noise(t)                        # scalars
        log_score = score_fn(x, jnp.full(x.shape[:1], sigma))   # (B, L, D)
        ...
        return x_new                                    # int32 (B, L)

and a sampler with state is a ``Sampler`` subclass registered with
``register_sampler``. Both run inside ``jax.jit``: traceable code only.

Categorical draws go through ``sedd.categorical.sample_categorical``:
"precise" (default) is an exponential race exact for small probabilities
(in two levels at large vocabularies); "gumbel32" is ``jax.random.categorical``
(float32 Gumbel-max), which draws a token of probability 1e-7 at about 0.52 of
its rate and one of 1e-8 at ~1e-4 of it (docs/sampling.md): an implicit top-p
that lowers the effective temperature (Zheng et al. 2024, arXiv 2409.02908).

Shapes: B batch, L length, D = graph.dim, V = graph.vocab_size, N steps.
"""

from sedd.categorical import METHODS as CATEGORICAL_METHODS
from sedd.sampling.context import Context, entropy, nucleus, shaped_law
from sedd.sampling.samplers import (GENERIC_OPTIONS, PREDICTORS, Analytic, Euler, FunctionPredictor, Sampler,
                                    UnknownSampler, check_graph, corrector_step, get_sampler, register_predictor,
                                    register_sampler)
from sedd.sampling.absorbing import (PLANNED_ORDERS, AbsorbingSampler, Confidence, Dilated, EntropyBound, FirstHitting,
                                     ReMDM, planned_rank)
from sedd.sampling.loop import (FINALS, Options, Samples, check_int, check_shape, conditioning, denoise_step,
                                one_step, options_from, run_loop, sample, start_carry, time_grid)
from sedd.sampling.long import sample_long
from sedd.sampling.prompts import MASK_CHAR, check_length, text_conditioning
from sedd.sampling import rounds, rows

__all__ = [
    "CATEGORICAL_METHODS", "Context", "entropy", "nucleus", "shaped_law", "GENERIC_OPTIONS", "PREDICTORS",
    "Analytic", "Euler", "FunctionPredictor", "Sampler", "UnknownSampler", "check_graph", "corrector_step",
    "get_sampler", "register_predictor", "register_sampler", "AbsorbingSampler", "Confidence", "EntropyBound",
    "FirstHitting", "ReMDM", "Dilated", "PLANNED_ORDERS", "planned_rank", "FINALS", "Options", "Samples",
    "check_int", "check_shape", "conditioning", "denoise_step", "one_step", "options_from", "run_loop", "sample",
    "start_carry", "time_grid", "sample_long",
    "MASK_CHAR", "check_length", "text_conditioning", "rows", "rounds"
]
