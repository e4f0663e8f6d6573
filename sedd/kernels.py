"""The speed paths behind the model's plain behaviour, and the dtype policy that picks them.

`sedd.model` reads as the DiT of the paper; what here makes it fast changes
no result beyond bfloat16's rounding: the dtype policy (``compute_dtype``), the
mixed-precision products and their gradient rules (``mixed_einsum``,
``linear_kwargs``), the attention paths built on them, chunked reductions of a
large output (``chunked``), cheaper dropout masks (``Dropout``) and the CPU
allocator's setting (``keep_freed_memory``). Each says why it exists;
docs/model.md tells the whole, docs/benchmarks.md measures it.

Shape letters: B batch, L sequence length, N attention heads, K head dim.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import importlib.util
import math
import os
import platform
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from sedd import rng

Array = jax.Array

# --------------------------------------------------------------------------- the dtype policy

COMPUTE_DTYPES = ("auto", "float32", "bfloat16")
DTYPE_ENV = "SEDD_COMPUTE_DTYPE"
"""An environment variable that, when set to one of COMPUTE_DTYPES, overrides every run's model.dtype.

The test suite's second pass sets it to bfloat16, so that a test whose outcome depends on the compute dtype
fails on a CPU without AVX512-BF16 too (where "auto" is float32), not only on the CPUs where "auto" is bfloat16.
"""


def _cpuinfo() -> str:
    """/proc/cpuinfo, or "" where there is none."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's processor string where there is none."""
    names = [line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines() if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


@functools.cache
def cpu_has_bfloat16_dots() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (x86 AVX512-BF16 or AMX-BF16, read off /proc/cpuinfo)."""
    flags = _cpuinfo().split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def compute_dtype(name: str) -> jnp.dtype:
    """`model.dtype` (one of COMPUTE_DTYPES; ``DTYPE_ENV`` replaces it when set) as a dtype.

    "auto" is bfloat16 on a GPU or TPU, or a CPU with bfloat16 dot
    instructions, where its products (float32 accumulation, `mixed_einsum`)
    outrun float32's; elsewhere bfloat16 would be converted in software, so
    float32. Parameters are float32 either way, so a run trained in one dtype
    loads and samples in the other.
    """
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"model.dtype={name!r}: expected one of {', '.join(COMPUTE_DTYPES)}")
    forced = os.environ.get(DTYPE_ENV)
    if forced:
        if forced not in COMPUTE_DTYPES:
            raise ValueError(f"{DTYPE_ENV}={forced!r}: expected one of {', '.join(COMPUTE_DTYPES)} (or unset)")
        name = forced
    if name == "auto":
        fast = jax.default_backend() != "cpu" or cpu_has_bfloat16_dots()
        name = "bfloat16" if fast else "float32"
    return jnp.dtype(name)


# --------------------------------------------------------------------------- mixed-precision products


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def mixed_einsum(spec: str, a: Array, b: Array, dtype: Any) -> Array:
    """`jnp.einsum(spec, a, b)` multiplied in `dtype`, accumulated and returned in float32.

    Mixed precision as autocast does it, both ways: the forward casts the
    operands to `dtype`; the backward casts the float32 cotangent to `dtype`
    too and multiplies in it, accumulating in float32, and returns each
    operand's gradient in that operand's own dtype (a float32 weight gets a
    float32 gradient, not one rounded to `dtype`). Left to itself, JAX's
    transpose would multiply the float32 cotangent by the bfloat16 operand in
    float32, so the backward products would run at float32's rate. Every
    index of `a` must appear in `b` or in the output, as in a Linear layer
    and in attention.
    """
    return _mixed_einsum_fwd(spec, a, b, dtype)[0]


def _mixed_einsum_fwd(spec, a, b, dtype):
    a_low, b_low = a.astype(dtype), b.astype(dtype)
    out = jnp.einsum(spec, a_low, b_low, preferred_element_type=jnp.float32)
    # Zero-size arrays carry the operands' dtypes to the backward pass.
    return out, (a_low, b_low, jnp.zeros(0, a.dtype), jnp.zeros(0, b.dtype))


def _mixed_einsum_bwd(spec, dtype, res, g):
    a_low, b_low, a_like, b_like = res
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    g = g.astype(dtype)
    da = jnp.einsum(f"{out},{sb}->{sa}", g, b_low, preferred_element_type=jnp.float32)
    db = jnp.einsum(f"{sa},{out}->{sb}", a_low, g, preferred_element_type=jnp.float32)
    return da.astype(a_like.dtype), db.astype(b_like.dtype)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


class _MixedDot:
    """nnx.Linear's `dot_general` (with its `promote_dtype` a no-op): `mixed_einsum` over the last axis."""

    def __init__(self, dtype: Any):
        self.dtype = dtype

    def __call__(self, lhs, rhs, dimension_numbers, precision=None, **unused):
        assert dimension_numbers == (((lhs.ndim - 1,), (0,)), ((), ())), dimension_numbers
        return mixed_einsum("...i,io->...o", lhs, rhs, self.dtype)


def _no_promotion(arrays, dtype=None, inexact=True):
    """nnx.Linear's `promote_dtype` for `_MixedDot`, which casts inside its own gradient rule."""
    return arrays


def linear_kwargs(dtype: Any) -> dict[str, Any]:
    """nnx.Linear keyword arguments for compute dtype `dtype`: none in float32; below, its product is
    `mixed_einsum` and its input casts are left to that product's rule."""
    if jnp.dtype(dtype) == jnp.float32:
        return {}
    return {"dot_general": _MixedDot(dtype), "promote_dtype": _no_promotion}


# --------------------------------------------------------------------------- chunked positions


def chunked(fn: Callable[..., Array], chunk: int, shared: Any, *arrays: Array) -> Array:
    """fn(shared, *arrays) -> float[B, L], computed `chunk` positions at a time, each recomputed for its gradient.

    The pattern of fused linear cross-entropy (Liger Kernel; Wijmans et al.
    2025, Cut Cross-Entropy): fn maps a chunk of positions to one value a
    position through a large intermediate (the [B, Lc, V] logits of an
    output projection); `jax.lax.scan` runs the chunks one after another and
    `jax.checkpoint` keeps only each chunk's inputs for the backward pass,
    which computes the intermediate again. The live intermediate is then
    [B, chunk, V] in both passes, at the price of one more forward of fn. row_chunks: [B, Lc, ...] cut
    along axis 1 from arrays [B, L, ...]; shared: a pytree every chunk reads whole (weights); chunk: dividing L,
    0 or >= L calls fn once on everything.
    """
    b, l = arrays[0].shape[:2]
    if chunk <= 0 or chunk >= l:
        return fn(shared, *arrays)
    if l % chunk:
        raise ValueError(f"training.loss_chunk={chunk} must divide the sequence length L={l} (0: no chunks)")
    n = l // chunk
    cut = lambda a: jnp.moveaxis(a.reshape(b, n, chunk, *a.shape[2:]), 1, 0)  # noqa: E731  (n, B, Lc, ...)
    body = jax.checkpoint(fn)
    _, out = jax.lax.scan(lambda carry, xs: (carry, body(shared, *xs)), None, tuple(cut(a) for a in arrays))
    return jnp.moveaxis(out, 0, 1).reshape(b, l)  # (B, L)


# --------------------------------------------------------------------------- attention

ATTENTION_IMPLEMENTATIONS = ("auto", "mixed", "cudnn")
ATTENTION = os.environ.get("SEDD_ATTENTION", "auto")
"""The attention path of `mixed_attention`, read when a function is traced: "mixed" everywhere;
"cudnn" on a GPU (cuDNN's fused flash attention) and "mixed" elsewhere; "auto" is `AUTO_GPU_ATTENTION`
on a GPU and "mixed" elsewhere. Set by the environment variable SEDD_ATTENTION or by assigning it."""
AUTO_GPU_ATTENTION = "cudnn"
"""What "auto" picks on a GPU: cuDNN's, faster than "mixed" there (docs/benchmarks.md, "On a GPU")."""


def _on_gpu() -> bool:
    """Whether the default backend is an NVIDIA GPU (cuDNN's; a ROCm GPU is not)."""
    if jax.default_backend() not in ("gpu", "cuda"):
        return False
    try:
        return "rocm" not in jax.devices()[0].client.platform_version.lower()
    except Exception:  # noqa: BLE001  (a client without platform_version)
        return True


def attention_implementation() -> str:
    """The attention path `mixed_attention` takes here: "mixed" or "cudnn" (a GPU's only)."""
    if ATTENTION not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"SEDD_ATTENTION={ATTENTION!r}: expected one of {', '.join(ATTENTION_IMPLEMENTATIONS)}")
    if not _on_gpu():
        return "mixed"
    return AUTO_GPU_ATTENTION if ATTENTION == "auto" else ATTENTION


def _cudnn_ok(q: Array, dtype: Any, mask: Array | None) -> bool:
    """cuDNN's flash attention takes these: no mask beyond causal, 16-bit products, head dim a multiple of 8 <= 128."""
    k = q.shape[-1]
    return mask is None and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and k % 8 == 0 and k <= 128


def mixed_attention(q: Array, k: Array, v: Array, causal: bool, dtype: Any, mask: Array | None = None) -> Array:
    """Softmax attention of q, k, v [B, L, N, K] -> float32[B, L, N, K], both products in `dtype`.

    What `jax.nn.dot_product_attention` computes, except that both products
    (and their gradients) multiply in `dtype` and return float32, and the
    softmax is normalised after the value product (`_softmax_values`); mask
    bool[L, L], True = attend, applies with causal too. On a GPU with
    ``attention_implementation()`` "cudnn" (no mask, a 16-bit dtype) it is
    cuDNN's fused flash attention instead, its output rounded to `dtype`.
    On a CPU it runs the training step faster than
    ``jax.nn.dot_product_attention`` in float32 too (docs/benchmarks.md).
    """
    if attention_implementation() == "cudnn" and _cudnn_ok(q, dtype, mask):
        out = jax.nn.dot_product_attention(
            q.astype(dtype), k.astype(dtype), v.astype(dtype), is_causal=causal, implementation="cudnn"
        )  # (B, L, N, K)
        return out.astype(jnp.float32)
    # Head-major operands: XLA's CPU runtime multiplies bfloat16 into float32
    # only when the batch axes lead (other layouts fail in its DotThunk).
    q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # (B, N, L, K)
    logits = mixed_einsum("bnqk,bnsk->bnqs", q / math.sqrt(q.shape[-1]), k, dtype)  # (B, N, L, L)
    if causal:
        l = q.shape[2]
        logits = jnp.where(jnp.tril(jnp.ones((l, l), bool)), logits, -jnp.inf)
    if mask is not None:
        logits = jnp.where(mask, logits, -jnp.inf)
    att = _softmax_values(logits, v, dtype)  # (B, N, L, K)
    return jnp.swapaxes(att, 1, 2)  # (B, L, N, K)


def cache_attention(q: Array, keys: Array, values: Array, mask: Array, dtype: Any) -> Array:
    """Softmax attention of a chunk over the slots of a decoding cache, grouped: q [G, L, K] over keys, values
    [G, S, K], G = batch x heads; mask bool, broadcastable to [L, S] (or [G, L, S]), True = attend.

    ``mixed_attention``'s arithmetic on a cache laid out as it is read, groups first, three axes: a
    write in place then a read leaves XLA one buffer, where a leading axis of one ([1, N, S, K] at batch 1)
    made its CPU compiler copy every layer's cache at each step (docs/model.md, "Decoding"). A forward
    pass (decoding): its gradient is JAX's own. Returns float32[G, L, K].
    """
    logits = mixed_einsum("gqk,gsk->gqs", q / math.sqrt(q.shape[-1]), keys, dtype)  # (G, L, S)
    logits = jnp.where(mask, logits, -jnp.inf)
    return _softmax_values(logits[None], values[None], dtype)[0]  # (G, L, K)


def unit_context_attention(
    q: Array, k: Array, v: Array, context: tuple[Array, Array], unit: int, mask: Array, dtype: Any
) -> Array:
    """Softmax attention of each query over its own unit of the chunk and the context positions `mask` allows.

    ``mixed_attention(q, [k ; ck], [v ; cv], mask=[U | mask])``, U the
    block-diagonal mask of units of `unit` consecutive positions, without the
    logits off U's diagonal blocks, which it would compute and discard: the
    units' (B, N, L / u, u, u) logits and the context's (B, N, L, S) share one
    softmax. The same values to float rounding. A forward pass (a block
    model's bound): its gradient is JAX's own. q, k, v [B, L, N, K], L a multiple
    of u; context (ck, cv) each [B, S, N, K]; mask bool[L, S]. Returns float32[B, L, N, K].
    """
    b, length, n, kd = q.shape
    units = length // unit
    q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # (B, N, L, K)
    ck, cv = (jnp.swapaxes(a, 1, 2) for a in context)  # (B, N, S, K)
    q = q / math.sqrt(kd)
    by_unit = lambda a: a.reshape(b, n, units, unit, a.shape[-1])  # noqa: E731  (B, N, L, X) -> (B, N, L/u, u, X)
    own = mixed_einsum("bnuqk,bnusk->bnuqs", by_unit(q), by_unit(k), dtype).reshape(b, n, length, unit)  # (B, N, L, u)
    # The mask as an added 0 / -inf: the same logits, and XLA's CPU fuses an add into the product where a select
    # of the (B, N, L, S) logits is written out and read again (docs/block_diffusion.md, "The cost of the bound").
    bias = jnp.where(mask, 0.0, -jnp.inf).astype(jnp.float32)  # (L, S)
    far = mixed_einsum("bnqk,bnsk->bnqs", q, ck, dtype) + bias  # (B, N, L, S)
    top = jnp.maximum(own.max(-1, keepdims=True), far.max(-1, keepdims=True))  # (B, N, L, 1), finite: own unit
    w_own, w_far = jnp.exp(own - top), jnp.exp(far - top)
    total = w_own.sum(-1, keepdims=True) + w_far.sum(-1, keepdims=True)  # (B, N, L, 1)
    out = jnp.einsum(
        "bnuqs,bnusk->bnuqk", by_unit(w_own).astype(dtype), by_unit(v).astype(dtype), preferred_element_type=jnp.float32
    ).reshape(b, n, length, kd)  # (B, N, L, K)
    out = out + jnp.einsum("bnqs,bnsk->bnqk", w_far.astype(dtype), cv.astype(dtype), preferred_element_type=jnp.float32)
    return jnp.swapaxes(out / total, 1, 2)  # (B, L, N, K)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _softmax_values(logits: Array, v: Array, dtype: Any) -> Array:
    """softmax(logits) @ v, normalised after the product; float32[B, N, L, K].

    With W = exp(logits - max) and S its row sums, the output is (W v) / S:
    the division runs over (B, N, L, K), not over the L x L weights, and the
    product multiplies W and v in `dtype`. The backward pass is softmax's, in
    the same order: with g = dO / S and R = g v^T (a `dtype` product),
    dlogits = W R - (W / S) rowsum(W R), where W is the rounded W of the
    forward product, so the two terms cancel as exactly as softmax's own.
    """
    return _softmax_values_fwd(logits, v, dtype)[0]


def _softmax_values_fwd(logits, v, dtype):
    w = jnp.exp(logits - logits.max(axis=-1, keepdims=True))  # (B, N, L, L)
    total = w.sum(axis=-1, keepdims=True)  # (B, N, L, 1)
    w_low, v_low = w.astype(dtype), v.astype(dtype)
    out = jnp.einsum("bnqs,bnsk->bnqk", w_low, v_low, preferred_element_type=jnp.float32) / total
    return out, (w_low, v_low, total, jnp.zeros(0, v.dtype))


def _softmax_values_bwd(dtype, res, d_out):
    w_low, v_low, total, v_like = res
    g = (d_out / total).astype(dtype)  # (B, N, L, K)
    d_v = jnp.einsum("bnqs,bnqk->bnsk", w_low, g, preferred_element_type=jnp.float32)  # (B, N, L, K)
    wr = w_low.astype(jnp.float32) * jnp.einsum("bnqk,bnsk->bnqs", g, v_low, preferred_element_type=jnp.float32)
    d_logits = wr - w_low.astype(jnp.float32) / total * wr.sum(axis=-1, keepdims=True)  # (B, N, L, L)
    return d_logits, d_v.astype(v_like.dtype)


_softmax_values.defvjp(_softmax_values_fwd, _softmax_values_bwd)


# --------------------------------------------------------------------------- dropout


class Dropout(nnx.Dropout):
    """nnx.Dropout whose mask costs a quarter of the random bits: 16 an element, four from a threefry block.

    On a CPU the threefry blocks are most of what dropout costs. An element is
    kept when its 16 bits are at least ``round(rate * 2**16)``, so the drop
    rate is that over 2**16 (0.1 -> 0.1000061), and kept elements are divided
    by the exact keep probability, so the output's mean is the input's.
    """

    def __call__(self, inputs: Array, *, deterministic: bool | None = None, rngs=None) -> Array:
        drop = round(self.rate * 2**16)
        deterministic = self.deterministic if deterministic is None else deterministic
        # nnx.Dropout's own path: off, broadcast masks, rates 16 bits cannot draw, and its errors.
        if deterministic is None or deterministic or self.broadcast_dims or not 0 < drop < 2**16:
            return super().__call__(inputs, deterministic=deterministic, rngs=rngs)
        rngs = self.rngs if rngs is None else rngs
        if isinstance(rngs, nnx.Rngs):
            key = rngs[self.rng_collection]()
        elif isinstance(rngs, nnx.RngStream):
            key = rngs()
        elif isinstance(rngs, jax.Array):
            key = rngs
        else:
            raise TypeError(f"Dropout needs a key, an nnx.RngStream or nnx.Rngs to draw its mask; got {type(rngs)}")
        keep = rng.uint16(key, inputs.shape, out_sharding=jax.typeof(inputs).sharding) >= drop
        return jnp.where(keep, inputs * (2**16 / (2**16 - drop)), jnp.zeros_like(inputs))


# --------------------------------------------------------------------------- the CPU's allocator

_MALLOPT = {"M_TRIM_THRESHOLD": -1, "M_MMAP_THRESHOLD": -3, "M_ARENA_MAX": -8}  # glibc's malloc.h
_KEPT_MEMORY = {"M_ARENA_MAX": 1, "M_MMAP_THRESHOLD": 1 << 30, "M_TRIM_THRESHOLD": (1 << 31) - 1}


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the buffers XLA's CPU runtime frees, so that the next step reuses them.

    XLA CPU allocates each run's buffers from its compute threads, and glibc
    serves those from arenas of heaps of at most 64 MB, so a larger buffer is
    mapped afresh at every run and each page faults in again on first touch
    (docs/benchmarks.md, "Page faults"). One arena, no mapping under 1 GiB and
    no trimming under 2 GiB keep the freed pages; memory stays at its peak.

    It acts only before JAX's CPU backend starts (a thread keeps the arena it
    first allocated from): `sedd train`, `eval` and `distill` call it first
    (`sedd.cli.KEEPS_FREED_MEMORY`; not `sample` or `serve`, whose decoding
    loops run slower on one arena). A no-op returning False where an
    accelerator plugin is installed, on a C library other than glibc, or
    where ``SEDD_PLAIN_MALLOC`` is set.
    """
    if (
        os.environ.get("SEDD_PLAIN_MALLOC")
        or platform.system() != "Linux"
        or platform.libc_ver()[0] != "glibc"
        or accelerator_installed()
    ):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return all(libc.mallopt(_MALLOPT[k], v) == 1 for k, v in _KEPT_MEMORY.items())


def accelerator_installed() -> bool:
    """Whether JAX may find an accelerator (a PJRT plugin, libtpu), told without starting a backend."""
    platforms = (os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or "").lower()
    if platforms and all(p.strip() == "cpu" for p in platforms.split(",")):
        return False
    return bool(importlib.metadata.entry_points(group="jax_plugins")) or any(
        importlib.util.find_spec(m) is not None for m in ("jax_plugins", "libtpu")
    )
