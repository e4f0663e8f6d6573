"""Independent check of `sedd.sampling.sample` (every predictor, both graphs,
prefix/suffix conditioning), written from the "Public API contract" of
DESIGN.md only, without reading sedd/sampling.py, sedd/graphs.py or
tests/test_sampling.py.

Everything the check relies on is built here in numpy float64 from explicit
dense rate matrices (row = from, rows sum to 0):

    Uniform(N):   Q = ones((N, N)) / N - I                       dim N
    Absorbing(V): Q[i, V] = 1, Q[i, i] = -1 for i != V; row V 0,  dim V + 1

and the forward marginal P_sigma = scipy.linalg.expm(sigma Q) (the reference
chain below uses a float64 closed form pinned to scipy's expm to 1e-13, for
speed).

* A tiny known law p0 over all V**L token sequences (V = 3, L = 3, a seeded
  Dirichlet), its noised marginal p_sigma(x) = sum_x0 p0(x0) prod_l
  P_sigma[x0_l, x_l] by enumeration, and the exact log-score
  log p_sigma(x with x_l = y) - log p_sigma(x).  It is handed to the sampler
  as a jnp-traceable `score_fn`, which uses a closed form of exp(sigma Q)
  derived here (NOT sedd's):
      Uniform:   exp(sQ) = e^{-s} I + (1 - e^{-s}) J / N   (Q has eigenvalue 0 on
                 the ones vector and -1 on its complement)
      Absorbing: e^{-s} on the token diagonal, 1 - e^{-s} into the mask column,
                 mask row = e_mask   (each token jumps to mask at rate 1)
  and both are checked against scipy's expm first.

* The sampler's output law is compared with p0 by total variation.  The bound
  (see `tv_bound`) is, by the triangle inequality
      TV(empirical, p0) <= TV(empirical, law_S) + TV(law_S, p0),
  a statistical term plus a discretisation term:
    - statistical: mean + 5 sd of TV(empirical law of n exact draws, target),
      simulated with 400 multinomial replicates (the TV of n draws from law_S
      has, to first order, the same distribution since law_S is close to p0);
    - discretisation: 2 x TV(ref_S, p0), where ref_S is the EXACT law (no Monte
      Carlo: a Markov chain propagated over all D**L states in float64) of a
      reference implementation, written here from the SEDD paper, of the same
      scheme at the same number of steps S (time grid linspace(1, eps, S+1);
      euler = tau-leaping with the reverse rate Q[y, x] s_y; analytic =
      Tweedie, probs_j = (exp(-dsigma Q)^T s)_j exp(dsigma Q)[j, x]; final
      Tweedie denoise from sigma(eps) to 0, the absorbing one restricted to
      tokens).  The factor 2 covers an implementation that discretises a bit
      differently (another grid convention): for these first-order schemes
      halving the steps roughly doubles the error, and `check_reference_chain`
      measures that doubling (TV_ref(S/2) / TV_ref(S)) and checks that the
      reference converges to p0 (TV_ref(4096) small).
  The TV to ref_S itself is also printed, for information only.

    python -m pytest tests/test_independent_sampling.py -q
    python tests/test_independent_sampling.py          # table, exit 1 on disagreement
    python tests/test_independent_sampling.py --slow   # also the heavy variants
"""

import functools
import itertools
import os
import sys
import time

import numpy as np
import scipy.linalg

import jax
import jax.numpy as jnp

try:
    import pytest
except ImportError:  # script use without pytest
    pytest = None

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sedd.graphs
import sedd.noise
import sedd.sampling

V = 3                 # vocabulary (tokens 0..V-1)
L = 3                 # sequence length
N_SAMPLES = 20_000    # samples per sampler run (default runs)
STEPS = 128           # sampler steps (default runs)
EPS = 1e-5            # sampler's default final time
LOGLIN_EPS = 1e-3     # LogLinear(1e-3) for the absorbing graph
GEO = (1e-3, 15.0)    # Geometric(1e-3, 15) for the uniform graph
SEED = 0

GRAPH_KINDS = ("absorbing", "uniform")
PREDICTORS = tuple(sorted(sedd.sampling.PREDICTORS))

RESULTS = []  # rows for the script's table: (name, tv, bound, tv_ref_info, ok)


# --------------------------------------------------------------------------
# dense reference (numpy float64)
# --------------------------------------------------------------------------
def dim(kind):
    return V + 1 if kind == "absorbing" else V


def dense_Q(kind):
    if kind == "uniform":
        return np.ones((V, V)) / V - np.eye(V)
    Q = np.zeros((V + 1, V + 1))
    for i in range(V):
        Q[i, V] = 1.0
        Q[i, i] = -1.0
    return Q


def expm(kind, sigma):
    return scipy.linalg.expm(sigma * dense_Q(kind))


def expm_closed(kind, sigma):
    """float64 closed form of exp(sigma Q) (derivation in the module docstring;
    valid for negative sigma too).  Used by the reference chain because scipy's
    expm costs ~1-10 ms a call on a loaded 2-core CI box; `check_closed_forms`
    pins it to scipy's expm to 1e-13."""
    e, one_m = np.exp(-sigma), -np.expm1(-sigma)
    if kind == "uniform":
        return e * np.eye(V) + one_m * np.ones((V, V)) / V
    P = np.zeros((V + 1, V + 1))
    P[np.arange(V), np.arange(V)] = e
    P[:V, V] = one_m
    P[V, V] = 1.0
    return P


def all_seqs(n_sym):
    return np.array(list(itertools.product(range(n_sym), repeat=L)), dtype=np.int64)


X0 = all_seqs(V)                      # [V**L, L] clean sequences
POW = V ** np.arange(L - 1, -1, -1)   # row-major index of a token sequence


def seq_index(x):
    return (np.asarray(x) * POW).sum(-1)


def make_p0():
    return np.random.default_rng(SEED).dirichlet(np.ones(len(X0)))


P0 = make_p0()


def sigma_of(kind, t):
    """sigma_bar(t) and its derivative, from the definitions (checked against
    sedd.noise in `check_noise`)."""
    t = np.asarray(t, dtype=np.float64)
    if kind == "absorbing":  # LogLinear(eps): sigma = -log(1 - (1 - eps) t)
        e = LOGLIN_EPS
        return -np.log1p(-(1 - e) * t), (1 - e) / (1 - (1 - e) * t)
    smin, smax = GEO  # Geometric: sigma = smin^(1-t) smax^t
    s = smin ** (1 - t) * smax ** t
    return s, s * np.log(smax / smin)


def make_graph(kind):
    return sedd.graphs.Absorbing(V) if kind == "absorbing" else sedd.graphs.Uniform(V)


def make_noise(kind):
    return sedd.noise.LogLinear(LOGLIN_EPS) if kind == "absorbing" else sedd.noise.Geometric(*GEO)


class StateSpace:
    """All D**L noised sequences, with neighbour tables for exact ratios."""

    def __init__(self, kind):
        self.kind = kind
        self.D = dim(kind)
        self.S = all_seqs(self.D)                         # [nS, L]
        self.nS = len(self.S)
        pw = self.D ** np.arange(L - 1, -1, -1)
        nbr = np.empty((self.nS, L, self.D), dtype=np.int64)
        for l in range(L):
            for y in range(self.D):
                z = self.S.copy()
                z[:, l] = y
                nbr[:, l, y] = (z * pw).sum(-1)
        self.nbr = nbr

    def p_sigma(self, sigma, p0=P0, scipy_expm=False):
        P = (expm if scipy_expm else expm_closed)(self.kind, sigma)
        K = np.ones((len(X0), self.nS))
        for l in range(L):
            K *= P[X0[:, l]][:, self.S[:, l]]
        return p0 @ K

    def ratios(self, sigma, p0=P0, scipy_expm=False):
        """exact s[s, l, y] = p_sigma(x_s with x_l = y) / p_sigma(x_s)."""
        ps = self.p_sigma(sigma, p0, scipy_expm)
        return ps[self.nbr] / ps[:, None, None]


@functools.lru_cache(maxsize=None)
def space(kind):
    return StateSpace(kind)


# --------------------------------------------------------------------------
# exact score handed to the sampler (jnp, traceable, own closed forms)
# --------------------------------------------------------------------------
def transition_jnp(kind, sigma):
    """exp(sigma Q) as [B, D, D] from sigma [B] (closed forms derived above)."""
    e = jnp.exp(-sigma)[:, None, None]
    one_m = -jnp.expm1(-sigma)[:, None, None]
    if kind == "uniform":
        return e * jnp.eye(V)[None] + one_m * jnp.ones((V, V))[None] / V
    tok = jnp.diag(jnp.array([1.0] * V + [0.0]))[None]          # token diagonal
    into_mask = jnp.zeros((V + 1, V + 1)).at[:V, V].set(1.0)[None]
    mask_row = jnp.zeros((V + 1, V + 1)).at[V, V].set(1.0)[None]
    return e * tok + one_m * into_mask + mask_row


@functools.lru_cache(maxsize=None)
def make_score_fn(kind):
    D = dim(kind)
    X0j = jnp.asarray(X0, dtype=jnp.int32)
    p0j = jnp.asarray(P0, dtype=jnp.float32)

    @jax.jit
    def score_fn(x, sigma):
        x = jnp.asarray(x).astype(jnp.int32)
        B = x.shape[0]
        sigma = jnp.broadcast_to(jnp.reshape(jnp.asarray(sigma, jnp.float32), (-1,)), (B,))
        P = transition_jnp(kind, sigma)                                  # [B, D, D]
        Pk = P[:, X0j, :]                                                # [B, K, L, D]
        idx = jnp.broadcast_to(x[:, None, :, None], Pk.shape[:-1] + (1,))
        A = jnp.take_along_axis(Pk, idx, axis=-1)[..., 0]                # [B, K, L]
        den = jnp.prod(A, -1) @ p0j                                      # [B]
        loo = jnp.stack([functools.reduce(jnp.multiply, [A[..., m] for m in range(L) if m != l],
                                          jnp.ones(A.shape[:-1], A.dtype))
                         for l in range(L)], -1)                        # [B, K, L] leave-one-out
        num = jnp.einsum("k,bkl,bkld->bld", p0j, loo, Pk)                # [B, L, D]
        tiny = jnp.finfo(jnp.float32).tiny
        log = jnp.log(jnp.maximum(num, tiny)) - jnp.log(jnp.maximum(den, tiny))[:, None, None]
        return jnp.where(jax.nn.one_hot(x, D, dtype=bool), 0.0, log).astype(jnp.float32)

    return score_fn


# --------------------------------------------------------------------------
# reference samplers: exact law by propagating the chain over all states
# --------------------------------------------------------------------------
def _tweedie_kernel(kind, ratios, ds, states):
    E = expm_closed(kind, -ds)
    F = expm_closed(kind, ds)
    stag = ratios @ E                           # sum_k s_k E[k, j]
    probs = stag * F.T[states]                  # * exp(ds Q)[j, x_l]
    return np.clip(probs, 0.0, None)


def _euler_kernel(kind, ratios, rate_dt, states):
    Q = dense_Q(kind)
    D = Q.shape[0]
    onehot = np.eye(D)[states].astype(bool)
    rev = np.where(onehot, 0.0, Q.T[states] * ratios) * rate_dt      # Q[y, x] s_y dt dsigma
    probs = np.where(onehot, 1.0 - rev.sum(-1, keepdims=True), rev)
    return np.clip(probs, 0.0, None)


def _clamp(kern, fixed):
    for l, tok in (fixed or ()):
        kern[:, l, :] = 0.0
        kern[:, l, tok] = 1.0
    return kern


def _step_matrix(sp, kern):
    kern = kern / kern.sum(-1, keepdims=True)
    T = np.ones((sp.nS, sp.nS))
    for l in range(L):
        T *= kern[:, l, :][:, sp.S[:, l]]
    return T


@functools.lru_cache(maxsize=None)
def reference_law(kind, predictor, steps, fixed=None):
    """Exact law over clean sequences [V**L] of the reference sampler;
    `fixed` = tuple of (position, token)."""
    sp = space(kind)
    D = sp.D
    # initial: the limit law, clamped
    if kind == "absorbing":
        init = np.zeros((L, D))
        init[:, V] = 1.0
    else:
        init = np.full((L, D), 1.0 / V)
    for l, tok in (fixed or ()):
        init[l] = 0.0
        init[l, tok] = 1.0
    law = np.ones(sp.nS)
    for l in range(L):
        law *= init[l][sp.S[:, l]]
    ts = np.linspace(1.0, EPS, steps + 1)
    dt = (1.0 - EPS) / steps
    for k in range(steps):
        t = ts[k]
        sig, dsig = sigma_of(kind, t)
        r = sp.ratios(sig)
        if predictor == "euler":
            kern = _euler_kernel(kind, r, dt * dsig, sp.S)
        elif predictor == "analytic":
            sig_next = sigma_of(kind, t - dt)[0]
            kern = _tweedie_kernel(kind, r, sig - sig_next, sp.S)
        else:
            raise ValueError(predictor)
        law = law @ _step_matrix(sp, _clamp(kern, fixed))
    sig = sigma_of(kind, ts[-1])[0]
    kern = _tweedie_kernel(kind, sp.ratios(sig), sig, sp.S)
    if kind == "absorbing":
        kern[..., V] = 0.0
    law = law @ _step_matrix(sp, _clamp(kern, fixed))
    tokens_only = (sp.S < V).all(-1)
    assert law[~tokens_only].sum() < 1e-12
    out = np.zeros(len(X0))
    out[seq_index(sp.S[tokens_only])] = law[tokens_only]
    return out


def conditional(fixed):
    keep = np.ones(len(X0), dtype=bool)
    for l, tok in fixed:
        keep &= X0[:, l] == tok
    p = np.where(keep, P0, 0.0)
    return p / p.sum()


# --------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------
def tv(p, q):
    return 0.5 * np.abs(np.asarray(p) - np.asarray(q)).sum()


@functools.lru_cache(maxsize=None)
def _stat_term(target_key, n, reps=400):
    target = np.array(target_key)
    rng = np.random.default_rng(12345)
    counts = rng.multinomial(n, target / target.sum(), size=reps)
    tvs = 0.5 * np.abs(counts / n - target).sum(-1)
    return tvs.mean() + 5.0 * tvs.std(ddof=1)


def tv_bound(target, n, ref_law):
    """statistical term (mean + 5 sd of the TV of n exact draws) + 2 x the exact
    discretisation error of the reference scheme at the same steps."""
    return _stat_term(tuple(np.round(target, 15)), n) + 2.0 * tv(ref_law, target)


def empirical(samples):
    x = np.asarray(samples)
    valid = ((x >= 0) & (x < V)).all(-1)
    counts = np.bincount(seq_index(x[valid]), minlength=len(X0)).astype(np.float64)
    # invalid rows (a mask id, out of range) count against TV as an extra bin
    return counts / len(x), (~valid).mean()


def tv_to(samples, target):
    emp, bad = empirical(samples)
    return tv(emp, target) + 0.5 * bad


# --------------------------------------------------------------------------
# running the sampler under test
# --------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def run_sampler(kind, predictor, steps, n, fixed=None, seed=1):
    shape = (n, L)
    kw = {}
    if fixed is not None:
        mask = np.zeros(shape, dtype=bool)
        toks = np.zeros(shape, dtype=np.int32)
        for l, tok in fixed:
            mask[:, l] = True
            toks[:, l] = tok
        kw = dict(fixed_mask=jnp.asarray(mask), fixed_tokens=jnp.asarray(toks))
    t0 = time.time()
    out = sedd.sampling.sample(jax.random.key(seed), make_score_fn(kind), make_graph(kind),
                               make_noise(kind), shape, steps, predictor=predictor, **kw)
    out = jax.block_until_ready(out)
    arr = np.asarray(out)
    assert arr.shape == shape, (arr.shape, shape)
    assert out.dtype == jnp.int32, out.dtype
    return arr, time.time() - t0


def _record(name, tv_val, bound, info=""):
    ok = bool(tv_val <= bound)
    RESULTS.append((name, tv_val, bound, info, ok))
    return ok


# --------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------
def check_closed_forms():
    """my jnp exp(sigma Q) against scipy expm (float32 in jnp)."""
    sig = np.array([1e-6, 1e-5, 1e-3, 0.1, 1.0, 5.0, 15.0])
    for kind in GRAPH_KINDS:
        got = np.asarray(transition_jnp(kind, jnp.asarray(sig, jnp.float32)), dtype=np.float64)
        for s, g in zip(sig, got):
            want = expm(kind, s)
            err = np.abs(g - want).max()
            assert err < 2e-7, (kind, s, err)
            assert np.allclose(want.sum(1), 1.0)
        for s in np.concatenate([sig, -sig[:5]]):   # numpy float64 closed form, +-sigma
            want = expm(kind, s)
            err = np.abs(expm_closed(kind, s) - want).max() / np.abs(want).max()
            assert err < 1e-13, (kind, s, err)
    RESULTS.append(("closed forms = scipy expm", 0.0, 0.0,
                    "jnp f32 max abs err < 2e-7, np f64 rel < 1e-13", True))


def check_noise():
    """the reference chain's sigma(t) formulas agree with sedd.noise."""
    t = np.array([1e-5, 1e-3, 0.1, 0.5, 0.9, 1.0])
    for kind in GRAPH_KINDS:
        s, ds = make_noise(kind)(jnp.asarray(t, jnp.float32))
        ws, wds = sigma_of(kind, t)
        assert np.allclose(np.asarray(s), ws, rtol=1e-4, atol=0), (kind, s, ws)
        assert np.allclose(np.asarray(ds), wds, rtol=1e-4, atol=0), (kind, ds, wds)
    RESULTS.append(("sigma(t) formulas = sedd.noise", 0.0, 0.0, "rtol 1e-4", True))


def check_score_fn():
    """the jnp score_fn against the float64 enumeration, on every state."""
    for kind in GRAPH_KINDS:
        sp = space(kind)
        fn = make_score_fn(kind)
        for sig in (1e-5, 1e-3, 0.1, 1.0, 6.9, 15.0):
            want = np.log(sp.ratios(sig, scipy_expm=True))
            got = np.asarray(fn(jnp.asarray(sp.S, jnp.int32), jnp.full((sp.nS,), sig, jnp.float32)))
            # sigma is rounded to float32 before use: the log ratios move by
            # O(|d log r / d sigma| * 6e-8 sigma), well under 2e-4 here
            err = np.abs(got - want).max()
            assert err < 2e-4, (kind, sig, err)
            assert (got[np.eye(sp.D, dtype=bool)[sp.S]] == 0).all()
    RESULTS.append(("score_fn = float64 enumeration", 0.0, 0.0, "max |dlog| < 2e-4", True))


def check_reference_chain():
    """the reference discretisation converges to p0 and its error roughly
    halves when the steps double (so 2 x TV_ref(S) covers another grid)."""
    for kind in GRAPH_KINDS:
        for pred in PREDICTORS:
            e_half = tv(reference_law(kind, pred, STEPS // 2), P0)
            e = tv(reference_law(kind, pred, STEPS), P0)
            e_fine = tv(reference_law(kind, pred, 4096), P0)
            info = f"ref TV S/2={e_half:.2e} S={e:.2e} 4096={e_fine:.2e}"
            ok = e_fine < 2e-3 and e_fine < e and e <= e_half + 1e-12
            RESULTS.append((f"reference chain {kind}/{pred}", e, 2 * e, info, ok))
            assert ok, info


def check_sampler(kind, predictor, steps=STEPS, n=N_SAMPLES):
    x, secs = run_sampler(kind, predictor, steps, n)
    if kind == "absorbing":
        assert not (x == V).any(), f"mask id in output: {(x == V).mean():.2e} of positions"
    assert ((x >= 0) & (x < V)).all()
    ref = reference_law(kind, predictor, steps)
    val = tv_to(x, P0)
    bound = tv_bound(P0, n, ref)
    info = f"TV to ref_S {tv_to(x, ref):.4f}, {secs:.1f}s"
    ok = _record(f"{kind}/{predictor} S={steps} n={n}", val, bound, info)
    assert ok, f"{kind}/{predictor}: TV {val:.4f} > bound {bound:.4f} ({info})"


def check_conditioning(predictor, where, steps=STEPS, n=N_SAMPLES):
    kind = "absorbing"
    fixed = ((0, 1),) if where == "prefix" else ((L - 1, 2),)
    x, secs = run_sampler(kind, predictor, steps, n, fixed=fixed)
    for l, tok in fixed:
        assert (x[:, l] == tok).all(), f"fixed position {l} not {tok}: {np.unique(x[:, l])}"
    assert not (x == V).any()
    target = conditional(fixed)
    ref = reference_law(kind, predictor, steps, fixed)
    val = tv_to(x, target)
    bound = tv_bound(target, n, ref)
    info = f"TV to ref_S {tv_to(x, ref):.4f}, {secs:.1f}s"
    ok = _record(f"absorbing/{predictor} {where} {fixed} S={steps}", val, bound, info)
    assert ok, f"{predictor}/{where}: TV {val:.4f} > bound {bound:.4f} ({info})"


def check_uniform_clamp(predictor, n=2000):
    """uniform graph: conditioning is approximate (documented), but the fixed
    positions must still equal the given tokens exactly."""
    fixed = ((0, 2), (L - 1, 0))
    x, _ = run_sampler("uniform", predictor, 32, n, fixed=fixed)
    for l, tok in fixed:
        assert (x[:, l] == tok).all()
    RESULTS.append((f"uniform/{predictor} clamp exact", 0.0, 0.0, "fixed tokens kept", True))


def check_doubling(kind, predictor, n=100_000):
    """heavy: 2S steps and 5x the samples; the measured change of TV when the
    steps double stays inside the statistical noise + reference margin."""
    check_sampler(kind, predictor, steps=2 * STEPS, n=n)
    a, _ = run_sampler(kind, predictor, STEPS, n, seed=2)   # independent key
    b, _ = run_sampler(kind, predictor, 2 * STEPS, n)        # cached from above
    ea, _ = empirical(a)
    eb, _ = empirical(b)
    d = tv(ea, eb)
    # two independent empirical laws: statistical term of each, plus both
    # reference discretisation errors
    bound = (2 * _stat_term(tuple(np.round(P0, 15)), n)
             + 2 * tv(reference_law(kind, predictor, STEPS), P0)
             + 2 * tv(reference_law(kind, predictor, 2 * STEPS), P0))
    ok = _record(f"{kind}/{predictor} TV(S, 2S) n={n}", d, bound, "doubling")
    assert ok


# --------------------------------------------------------------------------
# pytest
# --------------------------------------------------------------------------
if pytest is not None:
    def test_closed_forms():
        check_closed_forms()

    def test_noise_formulas():
        check_noise()

    def test_score_fn():
        check_score_fn()

    def test_reference_chain():
        check_reference_chain()

    @pytest.mark.parametrize("kind", GRAPH_KINDS)
    @pytest.mark.parametrize("predictor", PREDICTORS)
    def test_sampler_law(kind, predictor):
        check_sampler(kind, predictor)

    @pytest.mark.parametrize("where", ("prefix", "suffix"))
    @pytest.mark.parametrize("predictor", PREDICTORS)
    def test_conditioning(predictor, where):
        check_conditioning(predictor, where)

    @pytest.mark.parametrize("predictor", PREDICTORS)
    def test_uniform_clamp_exact(predictor):
        check_uniform_clamp(predictor)

    @pytest.mark.slow
    @pytest.mark.parametrize("kind", GRAPH_KINDS)
    @pytest.mark.parametrize("predictor", PREDICTORS)
    def test_doubling_slow(kind, predictor):
        check_doubling(kind, predictor)


# --------------------------------------------------------------------------
# script
# --------------------------------------------------------------------------
def main(argv):
    checks = [("closed forms", check_closed_forms), ("noise", check_noise),
              ("score_fn", check_score_fn), ("reference chain", check_reference_chain)]
    checks += [(f"law {k}/{p}", functools.partial(check_sampler, k, p))
               for k in GRAPH_KINDS for p in PREDICTORS]
    checks += [(f"cond {p}/{w}", functools.partial(check_conditioning, p, w))
               for p in PREDICTORS for w in ("prefix", "suffix")]
    checks += [(f"clamp {p}", functools.partial(check_uniform_clamp, p)) for p in PREDICTORS]
    if "--slow" in argv:
        checks += [(f"doubling {k}/{p}", functools.partial(check_doubling, k, p))
                   for k in GRAPH_KINDS for p in PREDICTORS]
    errors = []
    for name, fn in checks:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report every check
            errors.append((name, f"{type(e).__name__}: {e}"))
    print(f"\n{'check':48s} {'TV':>8s} {'bound':>8s}  ok   info")
    for name, val, bound, info, ok in RESULTS:
        print(f"{name:48s} {val:8.4f} {bound:8.4f}  {'ok  ' if ok else 'FAIL'} {info}")
    for name, msg in errors:
        print(f"FAIL {name}: {msg}")
    bad = errors or any(not r[4] for r in RESULTS)
    print("\nDISAGREEMENT" if bad else "\nALL AGREE")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
