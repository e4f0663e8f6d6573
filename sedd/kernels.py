"""The speed paths behind the model's plain behaviour, and the dtype policy that picks them.

`sedd.model` reads as the DiT of the paper; what here makes it fast changes
no result beyond bfloat16's rounding (in float32 the Linear layers keep
nnx.Linear's own product; attention takes `mixed_attention` in every dtype).
Each piece and why it exists:

  compute_dtype(name)   "auto" | "float32" | "bfloat16" -> a dtype. "auto" is
                        bfloat16 where bfloat16 products run in hardware (a GPU
                        or TPU, a CPU with AVX512-BF16 or AMX-BF16); on other
                        CPUs XLA would convert bfloat16 in software.
  mixed_einsum          a product in bfloat16 accumulated and returned in float32,
                        both passes, as autocast does it. On XLA's CPU a bfloat16
                        product returned in bfloat16 is no faster than float32;
                        returned in float32 it runs on the bfloat16 dot
                        instructions. JAX's own transpose would run the backward
                        products in float32, hence the custom gradient rule.
  linear_kwargs(dtype)  the nnx.Linear hooks that make its product `mixed_einsum`.
  mixed_attention       softmax attention from two `mixed_einsum`-style products,
                        laid out head-major (the layout XLA's CPU runtime accepts
                        for bfloat16 into float32) and normalised after the value
                        product, so the division runs over (B, N, L, K), not the
                        (B, N, L, L) weights. In float32 too: on a CPU it runs
                        the training step faster than ``jax.nn.dot_product_attention``
                        (docs/benchmarks.md).
  attention_implementation()  which path `mixed_attention` takes: "mixed" (the
                        above), or on a GPU "cudnn", cuDNN's fused flash
                        attention (``jax.nn.dot_product_attention``), chosen by
                        ``SEDD_ATTENTION`` / ``ATTENTION``; never on a CPU, so
                        CPU numbers are unchanged whatever the setting.
  unit_context_attention  `mixed_attention` over a chunk's own units (blocks
                        of u positions) and an external context of keys and
                        values, without the logits between different units:
                        a block model's bound (``sedd.kinds.block``).
  Dropout               nnx.Dropout with masks from 16 random bits an element,
                        four elements from each threefry block (``sedd.rng.uint16``):
                        a quarter of the threefry work of ``jax.random.bernoulli``,
                        whose masks were most of what dropout cost on a CPU.
  chunked          a per-position reduction of a large intermediate (the
                        loss of the [B, L, V] output) run over chunks of
                        positions, each recomputed for its gradient, so the
                        whole intermediate is never live (training.loss_chunk).
  keep_freed_memory     glibc's malloc set to keep the buffers XLA's CPU runtime
                        frees, so that the next step reuses them instead of
                        faulting their pages in again (a CPU process only).

Shape letters: B batch, L sequence length, N attention heads, K head dim.
Measured speeds, with the commands that measure them: docs/benchmarks.md.
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


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's processor string where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def cpu_has_bfloat16_dots() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (x86 AVX512-BF16 or AMX-BF16, read off /proc/cpuinfo)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def compute_dtype(name: str) -> jnp.dtype:
    """`model.dtype` as a dtype; "auto" is bfloat16 where its products run fast, else float32.

    Fast means a GPU or TPU, or a CPU with bfloat16 dot instructions, where
    the model's bfloat16 products (float32 accumulation, `mixed_einsum`)
    outrun float32's. Elsewhere bfloat16 would be converted in software, so
    "auto" keeps float32. Parameters are float32 either way, so a run
    trained in one dtype loads and samples in the other.

    The environment's SEDD_COMPUTE_DTYPE (``DTYPE_ENV``), when set, replaces `name`.

    Args:
      name: one of COMPUTE_DTYPES.
    Returns:
      jnp.float32 or jnp.bfloat16.
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
    """nnx.Linear keyword arguments for compute dtype `dtype`.

    None in float32, which keeps nnx.Linear's own product; below float32 its
    product becomes `mixed_einsum` (multiply in `dtype`, accumulate and
    return float32) and its input casts are left to that product's rule.
    """
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
    [B, chunk, V] in both passes, at the price of one more forward of fn.

    Args:
      fn: (shared, *row_chunks) -> float[B, Lc], row_chunks [B, Lc, ...].
      chunk: positions a chunk, dividing L; 0 or >= L calls fn once on everything.
      shared: a pytree every chunk reads whole (weights).
      arrays: [B, L, ...], cut along axis 1.
    Returns:
      float[B, L], equal to fn(shared, *arrays).

    Raises:
      ValueError: chunk does not divide L.
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
"""What "auto" picks on a GPU: cuDNN's, which ran SEDD small's training step 1.38x as fast as "mixed" on an
H200 (docs/benchmarks.md, "On a GPU", has the figures and the command)."""


def _on_gpu() -> bool:
    """Whether the default backend is an NVIDIA GPU (cuDNN's; a ROCm GPU is not)."""
    if jax.default_backend() not in ("gpu", "cuda"):
        return False
    try:
        return "rocm" not in jax.devices()[0].client.platform_version.lower()
    except Exception:  # noqa: BLE001  (a client without platform_version)
        return True


def attention_implementation() -> str:
    """The attention path `mixed_attention` takes here: "mixed" or "cudnn" (a GPU's only).

    Raises:
      ValueError: ``ATTENTION`` is not one of ATTENTION_IMPLEMENTATIONS.
    """
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
    """Softmax attention with both products in `dtype`, accumulated in float32, the softmax in float32.

    What `jax.nn.dot_product_attention` computes, except that both products
    (and their gradients) multiply in `dtype` and return float32, and the
    softmax is normalised after the value product (`_softmax_values`).

    Args:
      q, k, v: [B, L, N, K].
      causal: mask the future.
      dtype: the products' dtype.
      mask: optional bool[L, L], True = attend (with causal too, both apply).
    Returns:
      float32[B, L, N, K].

    On a GPU with ``attention_implementation()`` "cudnn" (and no mask, a
    16-bit dtype) this is cuDNN's fused flash attention instead: the same
    function, its output rounded to `dtype` before the float32 cast.
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

    ``mixed_attention``'s arithmetic (both products in `dtype`, accumulated in float32, the softmax
    normalised after the value product), on a cache laid out as it is read: groups first, slots next,
    three axes. A caller that writes its chunk's slots into the cache in place and then reads it
    (``DDiTLayer.run``'s cache) leaves XLA one buffer: with a leading axis of one (batch 1, [1, N, S, K])
    XLA's CPU compiler reshapes the written cache for each reader and copies every layer's cache twice or
    thrice a step (docs/model.md, "Decoding"). A forward pass (decoding): its gradient is JAX's own.

    Returns:
      float32[G, L, K].
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
    softmax (one max, one sum), normalised after the value products as in
    ``mixed_attention``, both products in `dtype` accumulated in float32. The
    same values to float rounding. Made for a forward pass (``sedd.kinds.block``'s
    bound, where a noisy block sees itself and the clean blocks before it):
    its gradient is JAX's own, not ``mixed_attention``'s custom one.

    Args:
      q, k, v: [B, L, N, K], L a multiple of unit.
      context: (ck, cv), each [B, S, N, K].
      unit: u, positions a unit.
      mask: bool[L, S], True = attend to that context position.
      dtype: the products' dtype.
    Returns:
      float32[B, L, N, K].
    """
    b, length, n, kd = q.shape
    units = length // unit
    q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # (B, N, L, K)
    ck, cv = (jnp.swapaxes(a, 1, 2) for a in context)  # (B, N, S, K)
    q = q / math.sqrt(kd)
    by_unit = lambda a: a.reshape(b, n, units, unit, a.shape[-1])  # noqa: E731  (B, N, L, X) -> (B, N, L/u, u, X)
    own = mixed_einsum("bnuqk,bnusk->bnuqs", by_unit(q), by_unit(k), dtype).reshape(b, n, length, unit)  # (B, N, L, u)
    # The mask as an added 0 / -inf: the same logits, and XLA's CPU fuses an add into the product where a select
    # of the (B, N, L, S) logits is written out and read again (1.5x against 2.4x the unmasked L x L, 2 cores).
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

    ``jax.random.bernoulli`` and ``jax.random.bits`` run a threefry block (64
    bits) for every element, ``sedd.rng.uint16`` one for four, and on a CPU
    the blocks are most of what dropout costs. An element is kept when its 16
    bits are at least ``round(rate * 2**16)``, so the drop rate is that over
    2**16 (0.1 -> 0.1000061), and kept elements are divided by the exact
    keep probability, so the output's mean is the input's, as with
    nnx.Dropout.
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

    XLA CPU allocates each run of a compiled program's buffers from its
    compute threads.
    glibc serves a thread other than the main one from an arena of heaps of
    at most 64 MB, so a larger buffer is mapped afresh at every run and
    unmapped when freed, and each of its pages faults in again on first
    touch: on a small CPU the kernel's time for those faults is a large share
    of a step (measured in docs/benchmarks.md, "Page faults"). One arena, no
    mapping under 1 GiB and no trimming under 2 GiB keep the freed pages in
    the process instead; the cost is that its memory stays at its peak.

    Only a process that computes on the CPU gains, and only a call made
    before JAX's CPU backend starts (a thread keeps the arena it first
    allocated from): `sedd train`, `eval` and `distill` call it first
    (`sedd.cli.KEEPS_FREED_MEMORY`; not `sample` or `serve`, whose decoding
    loops run slower on one arena). A no-op returning False where an accelerator plugin is installed
    (`accelerator_installed`), on a C library other than glibc, or where the
    environment sets ``SEDD_PLAIN_MALLOC`` (to keep glibc's defaults: memory
    handed back).
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
