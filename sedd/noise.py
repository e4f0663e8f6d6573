r"""Noise schedules: the total noise sigma_bar(t) and its rate d sigma_bar / dt.

The forward chain runs with rate sigma(t) Q, so the marginal at time t is
exp(sigma_bar(t) Q) with sigma_bar(t) = int_0^t sigma(s) ds (Sec. 3.1 of
Lou et al. 2024). In code, `sigma` is sigma_bar (what the model sees and what
the graphs' transition takes) and `dsigma` is sigma(t) = d sigma_bar / dt
(the weight of the loss and the scale of the reverse rates).

A schedule is called as ``noise(t) -> (sigma_bar(t), dsigma_bar(t))`` for t of
any shape and dtype; it is a frozen dataclass, so hashable and usable as a
static argument of ``jax.jit``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Geometric:
    r"""sigma_bar(t) = sigma_min^{1-t} sigma_max^t  (Sec. 3.3 of Lou et al. 2024).

    d sigma_bar / dt = sigma_bar(t) (log sigma_max - log sigma_min). Used with
    the uniform graph; SEDD's configs take sigma_min = 1e-4, sigma_max = 20.
    """

    sigma_min: float = 1e-4
    sigma_max: float = 20.0

    def __post_init__(self):
        if not (0 < self.sigma_min < self.sigma_max):
            raise ValueError(
                "Geometric noise needs 0 < sigma_min < sigma_max, got "
                f"sigma_min={self.sigma_min!r}, sigma_max={self.sigma_max!r}"
            )

    def __call__(self, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        t = jnp.asarray(t, jnp.result_type(t, jnp.float32))
        log_ratio = math.log(self.sigma_max) - math.log(self.sigma_min)
        sigma = jnp.exp(math.log(self.sigma_min) + t * log_ratio)
        return sigma, sigma * log_ratio


@dataclasses.dataclass(frozen=True)
class LogLinear:
    r"""sigma_bar(t) = -log(1 - (1 - eps) t)  (Sec. 3.3 of Lou et al. 2024).

    For the absorbing graph the mask probability 1 - e^{-sigma_bar} is then
    (1 - eps) t, linear in t. d sigma_bar / dt = (1 - eps) / (1 - (1 - eps) t).
    eps keeps sigma_bar(1) = -log(eps) finite.
    """

    eps: float = 1e-3

    def __post_init__(self):
        if not (0 < self.eps < 1):
            raise ValueError(f"LogLinear noise needs eps in (0, 1), got eps={self.eps!r}")

    def __call__(self, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        t = jnp.asarray(t, jnp.result_type(t, jnp.float32))
        rate = 1 - self.eps
        return -jnp.log1p(-rate * t), rate / (1 - rate * t)


NOISES = {"geometric": Geometric, "loglinear": LogLinear}


def get_noise(name: str, **kwargs) -> Geometric | LogLinear:
    """The schedule called `name` ("geometric" or "loglinear")."""
    if name not in NOISES:
        raise ValueError(f"unknown noise schedule {name!r}; expected one of {sorted(NOISES)}")
    return NOISES[name](**kwargs)
