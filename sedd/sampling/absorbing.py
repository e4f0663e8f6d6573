"""The absorbing graph's own samplers: first hitting, confidence (MaskGIT), entropy bound (EB), ReMDM.

Each is registered by name in ``sedd.sampling.SAMPLERS`` with its equation
above its ``step``.

Shapes: B batch, L length, D = graph.dim, V = graph.vocab_size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sedd.categorical import sample_categorical
from sedd.sampling.samplers import Sampler, register_sampler

PLANNED_ORDERS = ("strided", "dilated")


def planned_rank(order: str, length: int, steps: int) -> np.ndarray:
    """int64[L]: the place of each position in a planned order of ``Confidence`` (0 first), a permutation.

    "strided": position l goes at step l mod N of N (``steps``), left to
    right within a step; "dilated": the bit-reversed l over ceil(log2 L)
    bits (0, L/2, L/4, 3L/4, ... for L a power of two), whatever N.
    """
    positions = np.arange(length)
    if order == "strided":
        key = (positions % max(steps, 1)) * length + positions
    elif order == "dilated":
        bits = max(1, (length - 1).bit_length())
        key = np.zeros(length, np.int64)
        for b in range(bits):
            key |= ((positions >> b) & 1) << (bits - 1 - b)
    else:
        raise ValueError(f"unknown planned order {order!r}; expected one of {PLANNED_ORDERS}")
    return np.argsort(np.argsort(key, kind="stable"), kind="stable")


TIE_GRID = 1e-2
"""Priorities computed from the network (confidence, margin, entropy) are compared on this grid."""


def tie_broken(key: jax.Array, priority: jax.Array, grid: float = TIE_GRID) -> jax.Array:
    """float32[B, L]: `priority` rounded to a multiple of `grid`, its ties put in a random order drawn from key.

    A network's output differs in its last bits from one CPU to another, and
    from a batch of 4 to the same rows alone. Positions the
    network cannot yet tell apart (all of them at the first step from all
    masks: the DDiT has no absolute position, so every masked position
    computes the same score) then differ only by that noise, and the CPU or
    the batch would decide which goes first. Rounded, they tie, and the tie
    is broken by the row's key: the same text on any CPU and in any batch.
    A jitter under a tenth of the grid orders the ties and nothing else. Any
    order chosen from the revealed tokens and independent randomness keeps
    the chain rule, so a sampler exact with the exact score stays exact.
    """
    return jnp.round(priority / grid) * grid - 0.1 * grid * jax.random.uniform(key, priority.shape)


def rank(priority: jax.Array) -> jax.Array:
    """int32[B, L]: 0 for the highest priority of each row, 1 for the next, ..."""
    return jnp.argsort(jnp.argsort(-priority, axis=-1), axis=-1)


class AbsorbingSampler(Sampler):
    """A sampler of the absorbing graph only, honouring temperature, top_p and the cache."""

    graphs = ("absorbing",)
    honours = frozenset({"temperature", "top_p", "cache"})


@register_sampler("first_hitting")
class FirstHitting(AbsorbingSampler):
    r"""The first-hitting sampler, Zheng et al. 2024 (arXiv 2409.02908), Alg. 1.

    In the absorbing reverse chain each of the k masked positions of a row at
    noise sigma was masked at an independent time whose masking probability
    m(s) = 1 - e^{-sigma_bar(s)} has CDF m(s) / m(t) on [0, t]. The next
    unmasking is the latest of k such times, so with u ~ U(0, 1)

        m(s) = m(t) u^{1/k},   sigma_s = -log(1 - m(s)),

    and then one masked position, uniformly, takes the token
    y ~ p(x0_l = y | x_t) (the normalised token score). With the exact score
    this is the reverse process exactly, one network call per token; a row
    runs at its own sigma (float[B] to the network). ``steps`` is the budget:
    with fewer steps than masked positions the final denoise fills the rest
    at each row's sigma.
    """

    def init(self, ctx, x, times):
        return jnp.broadcast_to(ctx.noise(times[0])[0], x.shape[:1]).astype(jnp.float32)  # (B,) sigma

    def step(self, ctx, key, carry, n, t, t_next):
        sigma = carry["state"]  # (B,)
        log_score, carry = ctx.evaluate(carry, sigma)
        x = carry["x"]
        b = x.shape[0]
        masked = x == ctx.graph.mask  # (B, L)
        k = masked.sum(-1)  # (B,)
        k_time, k_pos, k_tok = jax.random.split(key, 3)
        u = jax.random.uniform(k_time, (b,), minval=jnp.finfo(jnp.float32).tiny)
        log_m = jnp.log(-jnp.expm1(-sigma)) + jnp.log(u) / jnp.maximum(k, 1)
        sigma_next = -jnp.log1p(-jnp.exp(log_m))
        pos = jnp.argmax(jnp.where(masked, jax.random.uniform(k_pos, x.shape), -1.0), axis=-1)  # (B,)
        logits = jnp.take_along_axis(log_score, pos[:, None, None], axis=1)[:, 0, : ctx.graph.vocab_size]
        token = sample_categorical(k_tok, ctx.denoiser(logits), ctx.categorical)  # (B,)
        rows = jnp.arange(b)
        has = k > 0
        x = x.at[rows, pos].set(jnp.where(has, token, x[rows, pos]))
        return dict(carry, x=x, state=jnp.where(has, sigma_next, sigma))

    def denoise_sigma(self, ctx, carry, t):
        return carry["state"]


@register_sampler("confidence")
class Confidence(AbsorbingSampler):
    r"""Confidence-ordered unmasking: MaskGIT (Chang et al. 2022), LLaDA's low_confidence (Nie et al. 2025).

    At step n of N every masked position draws a candidate y_l ~ q_l (the
    denoiser with temperature / top_p), and the

        k_n = ceil(masked / (N - n))

    masked positions of highest priority take theirs (all are unmasked by the
    end). Priority by ``order``: "confidence" q_l(y_l), "margin" the gap
    between the two most probable tokens, "entropy" minus the entropy of
    q_l, "random" a uniform draw. With "random" and one position a step
    (N >= L) this is any-order autoregressive sampling, exact with the exact
    score (Zheng et al. 2024, Prop. 3.1; Ou et al. 2024); the other orders
    are heuristics. The network sees sigma_bar(t_n). The data-dependent
    priorities are compared on a grid of ``TIE_GRID``, ties in a random
    order (``tie_broken``: the same text on any CPU and in any batch).

    Two orders are planned, fixed by position alone (``planned_rank``, ``Dilated``), so that the
    positions a step writes together are far apart (the idea of DUS, Luxembourg et al. 2025). Any order
    fixed in advance keeps the chain rule, so both are exact with the exact score at any N where the
    positions of a step are independent given the rest.

    With ``threshold`` = tau > 0 (Fast-dLLM's parallel decoding, Wu et al.
    2025, arXiv 2505.22618, Sec. 3.3) a step also unmasks every position
    whose candidate has q_l(y_l) >= tau: k_n = max(ceil(masked / (N - n)),
    #{l masked : q_l(y_l) >= tau}), so a sure block is written in few calls
    and at least one position is taken a step (with order "confidence", the
    positions over tau are the first taken).
    """

    options = {"order": "confidence", "threshold": 0.0}
    ORDERS = ("confidence", "margin", "entropy", "random", "strided", "dilated")

    def check(self, options):
        if options["order"] not in self.ORDERS:
            raise ValueError(f"unknown order {options['order']!r}; expected one of {self.ORDERS}")
        tau = options.get("threshold", 0.0)
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 <= tau <= 1:
            raise ValueError(f"threshold must be a probability in [0, 1] (0: off), got {tau!r}")

    def count(self, ctx, masked, n, logits, prob=None):
        """int32[B]: positions to unmask this step (prob: the candidates' q_l(y_l), for the threshold)."""
        left = ctx.steps - n
        m = masked.sum(-1)
        k = (m + left - 1) // left
        tau = ctx.options.get("threshold", 0.0)
        if tau > 0 and prob is not None:
            k = jnp.maximum(k, (masked & (prob >= tau)).sum(-1))
        return k

    def priority(self, ctx, key, logits, token, prob):
        """float[B, L]: higher goes first."""
        order = ctx.options["order"]
        if order == "confidence":
            tau = ctx.options.get("threshold", 0.0)
            over = (prob >= tau) if tau > 0 else jnp.zeros(prob.shape, bool)
            return tie_broken(key, prob) + 2.0 * over  # the positions over the threshold first
        if order == "margin":
            top2 = jax.lax.top_k(ctx.denoiser(logits), 2)[0]  # (B, L, 2)
            return tie_broken(key, top2[..., 0] - top2[..., 1])
        if order == "entropy":
            return tie_broken(key, -ctx.entropy(logits))
        if order in PLANNED_ORDERS:
            rank = planned_rank(order, token.shape[-1], ctx.steps)
            return jnp.broadcast_to(-jnp.asarray(rank, jnp.float32), token.shape)
        return jax.random.uniform(key, token.shape)

    def step(self, ctx, key, carry, n, t, t_next):
        log_score, carry = ctx.evaluate(carry, ctx.noise(t)[0])
        x = carry["x"]
        k_tok, k_order = jax.random.split(key)
        logits = log_score[..., : ctx.graph.vocab_size]  # (B, L, V)
        token, prob = ctx.draw(k_tok, logits)  # (B, L) each
        masked = x == ctx.graph.mask
        priority = jnp.where(masked, self.priority(ctx, k_order, logits, token, prob), -jnp.inf)
        unmask = masked & (rank(priority) < self.count(ctx, masked, n, logits, prob)[:, None])
        return dict(carry, x=jnp.where(unmask, token, x))


@register_sampler("dilated")
class Dilated(Confidence):
    r"""``Confidence`` with a planned order: "dilated" (the default) or "strided", ``planned_rank``.

    Step n of N writes the L / N positions next in the order, each with its
    candidate y_l ~ q_l: "dilated" the bit-reversed positions (0, L/2, L/4,
    3L/4, ...: coarse to fine, far apart at every step; one order for all N, so
    step m of N / 2 writes what steps 2m and 2m + 1 of N do: the order `sedd
    distill` can distil), "strided" the positions l = n mod N. What the random
    positions lose and these do not: docs/distillation.md.
    """

    options = {"order": "dilated"}

    def check(self, options):
        if options["order"] not in PLANNED_ORDERS:
            raise ValueError(f"sampler 'dilated' takes order in {PLANNED_ORDERS}, got {options['order']!r}")


@register_sampler("entropy_bound")
class EntropyBound(Confidence):
    r"""The entropy-bounded (EB) sampler, Ben-Hamu et al. 2025 (arXiv 2505.24857), Alg. 1.

    The masked positions are sorted by the entropy H_l of their denoiser q_l
    (lowest first) and the longest prefix U with

        sum_{l in U} H_l - max_{l in U} H_l <= max_entropy      (nats)

    is unmasked, each with its candidate y_l ~ q_l (the left side bounds the
    mutual information the factorised draw ignores; the first position is
    always taken). At least ceil(masked / steps left) positions are taken so
    the draw ends within ``steps``: with steps >= L that floor is 1 and the
    bound holds at every step. Adaptive: steps left with nothing masked cost
    no network call.

    The entropies are rounded to ``ENTROPY_GRID`` nats and their ties put in
    a random order (``tie_broken``), so the text is the same in any batch and
    on any CPU.
    """

    options = {"max_entropy": 1.0}
    ENTROPY_GRID = TIE_GRID  # nats; far above float32 noise, far below the entropy gaps that order positions

    def check(self, options):
        if not (isinstance(options["max_entropy"], (int, float)) and options["max_entropy"] >= 0):
            raise ValueError(f"max_entropy must be a number >= 0, got {options['max_entropy']!r}")

    def rounded_entropy(self, ctx, logits):
        """float32[B, L]: H(q_l) rounded to ENTROPY_GRID nats, a multiple of it."""
        return jnp.round(ctx.entropy(logits) / self.ENTROPY_GRID) * self.ENTROPY_GRID

    def count(self, ctx, masked, n, logits, prob=None):
        entropy = self.rounded_entropy(ctx, logits)  # (B, L)
        ascending = jnp.sort(jnp.where(masked, entropy, jnp.inf), axis=-1)
        finite = jnp.where(jnp.isfinite(ascending), ascending, 0.0)
        before = jnp.cumsum(finite, axis=-1) - finite  # sum - max of each prefix
        m = masked.sum(-1)
        within = (before <= ctx.options["max_entropy"]) & (jnp.arange(masked.shape[1]) < m[:, None])
        return jnp.minimum(jnp.maximum(within.sum(-1), super().count(ctx, masked, n, logits)), m)

    def priority(self, ctx, key, logits, token, prob):
        return tie_broken(key, -ctx.entropy(logits), self.ENTROPY_GRID)


@register_sampler("left_to_right")
class LeftToRight(AbsorbingSampler):
    r"""Left to right, and several positions a call where the model is sure: semi-autoregressive parallel decoding.

    At step n of N the first masked position l_0 takes y ~ q_{l_0}; so does each masked position after it, in
    order, while its denoiser is sure, max_y q_l(y) >= tau (``threshold``); at least

        k_n = ceil(masked / (N - n))

    masked positions are taken in order, so all are written by the end. Which positions a step writes depends
    on the laws q_l alone, never on the tokens drawn, so with one position a step (tau = 1, N >= L) this is the
    chain rule from left to right: exact with the exact score. A run of sure positions drawn together from their
    marginals instead of one after another is off by at most sum_l (1 - max_y q_l(y)) < (run - 1)(1 - tau) in
    total variation (each law holds at least tau on one token, given the text before it or not), and not at all
    where the positions are independent given the text before them. Fast-dLLM's threshold (Wu et al. 2025,
    arXiv 2505.22618) on the position's law rather than on its drawn token, in the left-to-right order of
    Fast-dLLM v2's sub-blocks (arXiv 2509.26328): a block run with a token shift (model.token_shift) reads every
    position after a clean one as an AR network does, so its first position's law is an AR law and the rest are
    its lookahead (docs/block_diffusion.md).
    """

    options = {"threshold": 0.9}

    def check(self, options):
        tau = options["threshold"]
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 <= tau <= 1:
            raise ValueError(f"threshold must be a probability in [0, 1] (1: one position a step), got {tau!r}")

    def step(self, ctx, key, carry, n, t, t_next):
        log_score, carry = ctx.evaluate(carry, ctx.noise(t)[0])
        x = carry["x"]
        logits = log_score[..., : ctx.graph.vocab_size]  # (B, L, V)
        token, _ = ctx.draw(key, logits)  # (B, L)
        sure = jnp.max(ctx.denoiser(logits), axis=-1) >= ctx.options["threshold"]  # (B, L): the law, not the draw
        masked = x == ctx.graph.mask
        nth = jnp.cumsum(masked, axis=-1) * masked  # (B, L): 1 at the first masked position, 2 at the next, ...
        run = jnp.cumprod(~masked | sure | (nth == 1), axis=-1).astype(bool)  # up to the first unsure after it
        left = ctx.steps - n
        least = nth <= (masked.sum(-1, keepdims=True) + left - 1) // left  # (B, L): the first k_n in order
        return dict(carry, x=jnp.where(masked & (run | least), token, x))


@register_sampler("remdm")
class ReMDM(AbsorbingSampler):
    r"""Remasking sampler, Wang et al. 2025 (arXiv 2503.00307), Eq. (4)-(5) and Sec. 4.

    With alpha_t = e^{-sigma_bar(t)} the probability that a token is still
    unmasked at t, and a remasking probability sigma_r in [0, sigma_max],
    sigma_max = min(1, (1 - alpha_s) / alpha_t), a step t -> s < t draws

        masked z_l:    x_l ~ q_l with prob. (alpha_s - (1 - sigma_r) alpha_t) / (1 - alpha_t), else stays MASK
        unmasked z_l:  MASK with prob. sigma_r, else stays

    which has MDLM's marginals for any such sigma_r (sigma_r = 0 is the
    analytic step). ``schedule``:
      "cap"      sigma_r = min(eta, sigma_max);
      "rescale"  sigma_r = eta sigma_max;
      "loop"     alpha rises linearly to alpha_on at t_on, stays there until
                 t_off with sigma_r = eta (decode and remask at a fixed noise
                 level), then rises linearly to 1 at t = 0; sigma_r = 0
                 outside [t_off, t_on]. (alpha linear in t, as for MDLM's
                 log-linear schedule; the network sees sigma = -log alpha.)
    """

    options = {"schedule": "cap", "eta": 0.02, "t_on": 0.55, "t_off": 0.05, "alpha_on": 0.9}
    settles = False  # decoded tokens are masked again
    SCHEDULES = ("cap", "rescale", "loop")

    def check(self, options):
        if options["schedule"] not in self.SCHEDULES:
            raise ValueError(f"unknown schedule {options['schedule']!r}; expected one of {self.SCHEDULES}")
        if not 0 <= options["eta"] <= 1:
            raise ValueError(f"eta must be in [0, 1], got {options['eta']!r}")
        if not 0 < options["t_off"] < options["t_on"] < 1 or not 0 < options["alpha_on"] < 1:
            raise ValueError(
                f"need 0 < t_off < t_on < 1 and 0 < alpha_on < 1, got t_on={options['t_on']}, "
                f"t_off={options['t_off']}, alpha_on={options['alpha_on']}"
            )

    def alpha(self, ctx, t):
        """(alpha_t, 1 - alpha_t, the network's sigma) at time t, each float[]."""
        o = ctx.options
        if o["schedule"] != "loop":
            sigma = ctx.noise(t)[0]
            return jnp.exp(-sigma), -jnp.expm1(-sigma), sigma
        a1 = jnp.exp(-ctx.noise(jnp.float32(1.0))[0])
        t_on, t_off, a_on = o["t_on"], o["t_off"], o["alpha_on"]
        masked = jnp.where(
            t >= t_on,
            (1 - a_on) + (a_on - a1) * (t - t_on) / (1 - t_on),
            jnp.where(t >= t_off, 1 - a_on, (1 - a_on) * t / t_off),
        )  # 1 - alpha
        return 1 - masked, masked, -jnp.log1p(-masked)

    def step(self, ctx, key, carry, n, t, t_next):
        o = ctx.options
        a_t, m_t, sigma = self.alpha(ctx, t)
        a_s, m_s, _ = self.alpha(ctx, t_next)
        sigma_max = jnp.minimum(1.0, m_s / a_t)
        if o["schedule"] == "cap":
            remask = jnp.minimum(o["eta"], sigma_max)
        elif o["schedule"] == "rescale":
            remask = o["eta"] * sigma_max
        else:
            remask = jnp.where((t <= o["t_on"]) & (t_next >= o["t_off"]), jnp.minimum(o["eta"], sigma_max), 0.0)
        log_score, carry = ctx.evaluate(carry, sigma)
        x = carry["x"]
        k_tok, k_u = jax.random.split(key)
        token, _ = ctx.draw(k_tok, log_score[..., : ctx.graph.vocab_size])  # (B, L)
        unmask = jnp.clip((a_s - (1 - remask) * a_t) / m_t, 0.0, 1.0)
        u = jax.random.uniform(k_u, x.shape)
        masked = x == ctx.graph.mask
        mask = jnp.int32(ctx.graph.mask)
        x = jnp.where(masked, jnp.where(u < unmask, token, mask), jnp.where(u < remask, mask, x))
        return dict(carry, x=x)

    def denoise_sigma(self, ctx, carry, t):
        return self.alpha(ctx, t)[2]
