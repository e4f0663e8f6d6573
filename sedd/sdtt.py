r"""Self-distillation through time (SDTT; Deschenaux & Gulcehre 2024, arXiv 2410.21035): the math.

A sampler of the absorbing graph takes N steps on the grid 1 = t_0 > ... >
t_N = eps. SDTT trains a student whose *one* step t -> t - 2 dt writes what
the teacher writes in *two*, t -> t - dt -> t - 2 dt; rounds repeat it with
the student as the next teacher, halving the steps each round.

One step. At a masked position l the step t -> s of the euler and analytic
samplers (``sedd.sampling.samplers``, ``absorbing_jump``) is, with s_y the
score at sigma = sigma_bar(t) and c = e^{sigma_bar(t) - sigma_bar(s)} - 1,

    p(M -> y) = c s_y / Z   (y a token),    p(M -> M) = max(0, 1 - c S) / Z,
    S = sum_y s_y,   Z = max(1, c S),                                        (1)

and a token never moves. For a normalised network (MDLM's SUBS,
model.normalize) s_y = p(x0 = y | x_t) / (e^sigma - 1), so c S is the
schedule's unmasking probability and only the token law is learnt; SEDD's
unnormalised score also sets how likely the position unmasks.

Two steps. The teacher's step t -> u = t - dt is a product over positions,
so given x_u the second step u -> s factorises again. The two-step law of
position l, summed over the teacher's first draw, is

    q_l(y) = P1_l(y) + P1_l(M) E[P2_l(y) | x_u^l = M],    q_l(M) = P1_l(M) E[P2_l(M) | x_u^l = M],     (2)

with P1 the teacher's step (1) at x_t and P2 its step at x_u. One draw of
x_u, kept where l is still masked, gives

    q^_l = P1_l + P1_l(M) P2_l(. | x_u)   (the M entry: P1_l(M) P2_l(M)),                             (3)

whose expectation is q_l exactly: whether l unmasks in the first step is
independent of every other position's draw, so the other positions of x_u
have their right law given x_u^l = M. (SDTT's own target, the teacher's
x0-prediction at the step each position unmasked, weights the two steps by
P1(unmask) : P1(M) instead of (2)'s P1(unmask) : P1(M) P2(unmask); it is
distill.target = "x0", ``x0_target``.)

The loss. The student's one step p_l is (1) at x_t with c from t to s, a
product law over positions; for any product law p,

    KL(q_joint || prod_l p_l) = KL(q_joint || prod_l q_l) + sum_l KL(q_l || p_l),

so sum_l KL(q^_l || p_l) (``kl_forward``) estimates the forward KL of the
whole sequence without bias up to a constant (linear in q^). ``kl_backward``,
sum_l KL(p_l || q^_l), SDTT's best and the default, has for minimiser the
normalised geometric mean exp E_{x_u}[log q^_l] of the targets over the
teacher's first draws; ``tv`` is half the L1 distance. Why backward KL
(forward KL's student of an exact teacher is the teacher itself), and why a
planned order (``planned_loss_per_position``: positions written together are
far apart, so only the token laws are learnt): docs/distillation.md.

Shapes: B batch, L length, D = graph.dim, V = graph.vocab_size, n_b noise
groups (blocks) of a row: 1 for SEDD, L / b for block diffusion.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from sedd.categorical import sample_categorical
from sedd.graphs import Graph, log_expm1

DIVERGENCES = ("kl_forward", "kl_backward", "tv")
TARGETS = ("law", "x0")  # the two-step law, Eq. (3); SDTT's: its MASK mass, its tokens the second step's denoiser
LOG_FLOOR = -80.0  # log-probabilities are floored here (e^-80 ~ 2e-35): finite terms and gradients everywhere

BlockScoreFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
"""(x_t int32[B, L], x0 int32[B, L], sigma float[B, n_b]) -> log-score float32[B, L, D]: the network
at x_t, each noise group at its own sigma (block diffusion also reads x0's blocks before each)."""


def step_log_law(
    graph: Graph, log_score: jax.Array, x: jax.Array, sigma: jax.Array, sigma_next: jax.Array
) -> jax.Array:
    r"""log p(x_s^l = . | x_t): one euler / analytic step t -> s of the absorbing graph, Eq. (1), at every position.

    Computed in logs: log c = log(e^{dsigma} - 1) (``log_expm1``), log S a
    logsumexp, so a step of any size and a score of any scale stay finite.
    A token position is a point mass at its token. log_score float32[B, L, D]
    at x int32[B, L] and sigma_bar(t); sigma, sigma_next float[B, L]. Returns
    float32[B, L, D], floored at ``LOG_FLOOR``.
    """
    if not graph.absorb:
        raise ValueError("step_log_law is the absorbing graph's step; the uniform graph's moves every token")
    v = graph.vocab_size
    log_c = log_expm1(jnp.maximum(sigma - sigma_next, 1e-12))[..., None]  # (B, L, 1)
    tokens = log_c + log_score[..., :v].astype(jnp.float32)  # (B, L, V): log c s_y
    log_cs = jax.nn.logsumexp(tokens, axis=-1, keepdims=True)  # (B, L, 1): log c S
    log_z = jnp.maximum(log_cs, 0.0)  # log max(1, c S)
    stay = jnp.log(jnp.maximum(-jnp.expm1(jnp.minimum(log_cs, 0.0)), 0.0) + 1e-35)  # log max(0, 1 - c S)
    masked = jnp.concatenate([tokens, stay], axis=-1) - log_z  # (B, L, D)
    point = jnp.where(jax.nn.one_hot(x, graph.dim, dtype=bool), 0.0, LOG_FLOOR)
    return jnp.maximum(jnp.where((x == graph.mask)[..., None], masked, point), LOG_FLOOR)


def two_step_log_law(graph: Graph, log_p1: jax.Array, log_p2: jax.Array) -> jax.Array:
    """log q^ of Eq. (3): the first step's law (log_p1, at x_t), its MASK mass carried on by the second's (at x_u)."""
    m = graph.mask
    carried = log_p1[..., m : m + 1] + log_p2  # (B, L, D): P1(M) P2(.)
    tokens = jnp.logaddexp(log_p1[..., :m], carried[..., :m])
    return jnp.maximum(jnp.concatenate([tokens, carried[..., m:]], axis=-1), LOG_FLOOR)


def x0_target(graph: Graph, log_q: jax.Array, log_p2: jax.Array) -> jax.Array:
    """SDTT's target in the form of a step's law: the mass of MASK of `log_q`, the tokens as the second step's.

    SDTT (its ``_teacher_logprobs_on_mask``) asks the student's denoiser to
    match the teacher's at the step a position unmasks, and for a position
    still masked after the first step that is the teacher's denoiser at x_u:
    here q(M) stays the two-step law's and its token mass 1 - q(M) is shared
    as P2's tokens, P2(y) / (1 - P2(M)).
    """
    m = graph.mask
    stay = log_q[..., m : m + 1]
    tokens = log_p2[..., :m] - jax.nn.logsumexp(log_p2[..., :m], axis=-1, keepdims=True)
    moved = jnp.log(jnp.maximum(-jnp.expm1(stay), 1e-35))  # log(1 - q(M))
    return jnp.maximum(jnp.concatenate([tokens + moved, stay], axis=-1), LOG_FLOOR)


def divergence(name: str, log_q: jax.Array, log_p: jax.Array) -> jax.Array:
    """The divergence `name` of ``DIVERGENCES`` between the target q and the student p over the last axis: float[...].

    kl_forward: sum q (log q - log p); kl_backward: sum p (log p - log q); tv: sum |q - p| / 2.
    """
    q, p = jnp.exp(log_q), jnp.exp(log_p)
    if name == "kl_forward":
        return jnp.sum(q * (log_q - log_p), axis=-1)
    if name == "kl_backward":
        return jnp.sum(p * (log_p - log_q), axis=-1)
    if name == "tv":
        return 0.5 * jnp.sum(jnp.abs(q - p), axis=-1)
    raise ValueError(f"unknown distillation divergence {name!r}; expected one of {', '.join(DIVERGENCES)}")


def loss_per_position(
    key: jax.Array,
    teacher_fn: BlockScoreFn,
    student_fn: BlockScoreFn,
    graph: Graph,
    noise: Callable,
    x0: jax.Array,
    dt: jax.Array,
    *,
    block_size: int,
    t_min: float,
    t_end: float,
    divergence_name: str = "kl_backward",
    target: str = "x0",
) -> jax.Array:
    r"""One draw of the SDTT objective at every position: float32[B, L], nats.

    Each noise group (the row for SEDD, each block for block diffusion) draws
    t ~ U[t_min, 1]; u = max(t - dt, t_end), s = max(t - 2 dt, t_end) (t_end
    the sampler's last time, where its grid ends). x_t ~ p_t(. | x0); the
    teacher steps t -> u (one draw, x_u) and u -> s; the student steps t -> s.
    At each position still masked in x_u the divergence between the target
    (3) and the student's step (1); 0 elsewhere (a position the teacher
    unmasked at its first step is dropped: that choice is independent of
    the target, so the loss keeps its minimiser). The teacher's outputs
    carry no gradient.

    Args:
      teacher_fn, student_fn: ``BlockScoreFn``s.
      x0: int32[B, L] clean tokens.
      dt: float[] the teacher's step, (1 - t_end) / N for its N steps.
      block_size: positions of a noise group (L for SEDD).
      t_min: the lowest t drawn (training.sampling_eps); t_end: the sampler's last time (sampling.eps).
      target: "law" (Eq. (3)) or "x0" (SDTT's, ``x0_target``).
    """
    if target not in TARGETS:
        raise ValueError(f"unknown distillation target {target!r}; expected one of {', '.join(TARGETS)}")
    k_t, k_x, k_u = jax.random.split(key, 3)
    b, length = x0.shape
    groups = length // block_size
    t = (1.0 - t_min) * jax.random.uniform(k_t, (b, groups)) + t_min  # (B, n_b)
    u, s = jnp.maximum(t - dt, t_end), jnp.maximum(t - 2 * dt, t_end)
    (sig_t, _), (sig_u, _), (sig_s, _) = noise(t), noise(u), noise(s)  # (B, n_b) each
    at = lambda a: jnp.repeat(a, block_size, axis=1)  # noqa: E731  (B, n_b) -> (B, L)
    x_t = graph.sample_transition(k_x, x0, at(sig_t))  # (B, L)
    log_p1 = step_log_law(graph, jax.lax.stop_gradient(teacher_fn(x_t, x0, sig_t)), x_t, at(sig_t), at(sig_u))
    x_u = sample_categorical(k_u, jnp.exp(log_p1))  # (B, L)
    log_p2 = step_log_law(graph, jax.lax.stop_gradient(teacher_fn(x_u, x0, sig_u)), x_u, at(sig_u), at(sig_s))
    log_q = two_step_log_law(graph, log_p1, log_p2)
    if target == "x0":
        log_q = x0_target(graph, log_q, log_p2)
    log_p = step_log_law(graph, student_fn(x_t, x0, sig_t), x_t, at(sig_t), at(sig_s))
    return jnp.where(x_u == graph.mask, divergence(divergence_name, log_q, log_p), 0.0)


def planned_loss_per_position(
    key: jax.Array,
    teacher_fn: BlockScoreFn,
    student_fn: BlockScoreFn,
    graph: Graph,
    noise: Callable,
    x0: jax.Array,
    rank: jax.Array,
    teacher_steps: jax.Array,
    *,
    t_end: float,
    divergence_name: str = "kl_backward",
) -> jax.Array:
    r"""One draw of SDTT's objective for a sampler of a planned order (``sedd.sampling.Dilated``): float32[B, L].

    The sampler's step n of N writes the positions whose place in the order
    (`rank`) is in [n L/N, (n+1) L/N), each y_l ~ p(x0_l | x_t) (the
    denoiser: the token part of the score, normalised), the network at
    sigma_bar(t_n), t_n = 1 - n (1 - t_end) / N. Its positions are fixed in
    advance, so only the token laws are learnt: the student's one step m of
    N / 2 writes the positions of the teacher's steps 2m and 2m + 1 from
    its denoiser at x_{t_2m}, and the target of each is the teacher's
    denoiser at the step that writes it: at x_{t_2m} for the first group,
    at x_{t_2m+1} (the first group drawn from the teacher) for the second.
    For the second group one draw is unbiased for the two-step law (the
    mixture over the first group's draws), so SDTT's two targets ("law",
    "x0") are one here. Per row m ~ U{0, ..., N/2 - 1}; the divergence at
    the positions of the two groups, 0 elsewhere.

    rank: int32[L], the order (``sedd.sampling.absorbing.planned_rank``); teacher_steps: int32[] N, even
    and dividing L; t_end: the sampler's last time (sampling.eps).
    """
    k_m, k_u = jax.random.split(key)
    b, length = x0.shape
    per = length // teacher_steps  # positions a teacher step writes
    m = jax.random.randint(k_m, (b, 1), 0, teacher_steps // 2)  # (B, 1)
    dt = (1.0 - t_end) / teacher_steps.astype(jnp.float32)
    t = 1.0 - 2 * m[:, 0].astype(jnp.float32) * dt  # (B,)
    sig_t, sig_u = noise(t)[0][:, None], noise(t - dt)[0][:, None]  # (B, 1): one noise group a row
    first = (rank >= 2 * m * per) & (rank < (2 * m + 1) * per)  # (B, L)
    second = (rank >= (2 * m + 1) * per) & (rank < (2 * m + 2) * per)
    x_t = jnp.where(rank < 2 * m * per, x0, graph.mask)
    v = graph.vocab_size
    denoiser = lambda log_score: jax.nn.log_softmax(log_score[..., :v].astype(jnp.float32), axis=-1)  # noqa: E731
    log_p1 = denoiser(jax.lax.stop_gradient(teacher_fn(x_t, x0, sig_t)))  # (B, L, V)
    x_u = jnp.where(first, sample_categorical(k_u, jnp.exp(log_p1)), x_t)
    log_p2 = denoiser(jax.lax.stop_gradient(teacher_fn(x_u, x0, sig_u)))
    log_q = jnp.maximum(jnp.where(first[..., None], log_p1, log_p2), LOG_FLOOR)
    log_p = jnp.maximum(denoiser(student_fn(x_t, x0, sig_t)), LOG_FLOOR)
    return jnp.where(first | second, divergence(divergence_name, log_q, log_p), 0.0)
