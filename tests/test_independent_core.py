"""Independent check of the public API of `sedd.graphs` and `sedd.noise`.

Written from the "Public API contract" of DESIGN.md only, without reading the
implementation: every expectation is built here from an explicit dense rate
matrix Q in numpy float64 (row = from, rows sum to 0) and the forward marginal
P = scipy.linalg.expm(sigma * Q), p(x_t = j | x_0 = i) = P[i, j].

    Uniform(N):   Q = ones((N, N)) / N - I,                  dim N
    Absorbing(V): Q[i, V] = 1, Q[i, i] = -1 for i != V; row V = 0, dim V + 1

(scipy's expm agrees with a 40-digit mpmath expm to <= 2e-13 relative error,
entry by entry, on every Q and sigma used here, and keeps the exact zeros of
the absorbing graph, so the float64 tolerances below are not limited by it.)

Every deterministic check reports a scaled error (the scale is named at each
check) against a tolerance for float32 (in process, JAX's default) and for
float64 (a subprocess with jax_enable_x64).  Sampling checks compare empirical
laws with the exact ones by total variation (bound derived in `tv_bound`) and
check that zero-probability outcomes never occur.

    python -m pytest tests/test_independent_core.py -q
    python tests/test_independent_core.py          # summary table, exit 1 on disagreement
"""

import json
import math
import os
import subprocess
import sys
import traceback

import numpy as np
import scipy.linalg

import jax
import jax.numpy as jnp

SIGMAS = (1e-6, 1e-3, 0.1, 1.0, 5.0, 20.0)
GRAPHS = (("Uniform", 3), ("Uniform", 5), ("Absorbing", 3), ("Absorbing", 5))

# Tolerances on the scaled errors, per dtype.
TOL = {
    "float32": dict(exact=1e-7, prob=3e-6, ratio=1e-4, stag=1e-5, noise=3e-4),
    "float64": dict(exact=1e-15, prob=1e-12, ratio=1e-10, stag=1e-12, noise=1e-12),
}
FD_TOL = 1e-6  # central finite difference, h = 1e-5, float64 only


# --------------------------------------------------------------------------
# Dense reference
# --------------------------------------------------------------------------
def dense_Q(kind, n):
    if kind == "Uniform":
        return np.ones((n, n)) / n - np.eye(n)
    d = n + 1
    Q = np.zeros((d, d))
    for i in range(n):
        Q[i, n] = 1.0
        Q[i, i] = -1.0
    return Q


def expm(M):
    return scipy.linalg.expm(M)


def K(a):
    """K(a) = a (log a - 1), K(0) = 0."""
    a = np.asarray(a, dtype=np.float64)
    out = np.zeros_like(a)
    pos = a > 0
    out[pos] = a[pos] * (np.log(a[pos]) - 1.0)
    return out


def dense_score_entropy(Q, sigma, x, x0, s):
    """sum_{y != x} Q[y, x] (s_y - r_y log s_y + K(r_y)), and its magnitude scale."""
    P = expm(sigma * Q)
    assert P[x0, x] > 0
    r = P[x0, :] / P[x0, x]
    val, scale = 0.0, 0.0
    for y in range(Q.shape[0]):
        if y == x or Q[y, x] == 0:
            continue
        rlogs = r[y] * np.log(s[y]) if r[y] > 0 else 0.0  # r log s := 0 when r = 0
        k = float(K(r[y]))
        val += Q[y, x] * (s[y] - rlogs + k)
        scale += abs(Q[y, x]) * (abs(s[y]) + abs(rlogs) + abs(k))
    return val, scale


def dense_reverse_rate(Q, i, s):
    out = Q[:, i] * s
    out[i] = 0.0
    out[i] = -out.sum()
    return out


def tv_bound(D, n, delta=1e-9):
    """High-probability bound on TV(empirical law of n iid draws, true law).

    E|p^_j - p_j| <= sqrt(p_j (1 - p_j) / n) (Jensen), so
    E TV = 1/2 sum_j E|p^_j - p_j| <= 1/2 sum_j sqrt(p_j / n) <= 1/2 sqrt(D / n)
    (Cauchy-Schwarz).  Changing one draw moves TV by at most 1/n, so McDiarmid
    gives P(TV >= E TV + t) <= exp(-2 n t^2); t = sqrt(log(1/delta) / (2 n)).
    With delta = 1e-9 per law this is (0.5 sqrt(D) + 3.22) / sqrt(n), below the
    rule of thumb 4 sqrt(D / n) for every D >= 2, and about 0.01 at n = 2e5:
    a false alarm is essentially impossible, and any law that is wrong by more
    than ~2% in TV is caught.  The keys are fixed, so results are reproducible.
    """
    return 0.5 * math.sqrt(D / n) + math.sqrt(math.log(1.0 / delta) / (2.0 * n))


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
def fdtype():
    return "float64" if jax.config.jax_enable_x64 else "float32"


def tol(kind):
    return TOL[fdtype()][kind]


def jf(a):
    return jnp.asarray(np.asarray(a), dtype=jnp.float64 if fdtype() == "float64" else jnp.float32)


def ji(a):
    return jnp.asarray(np.asarray(a), dtype=jnp.int32)


def make_graph(kind, n):
    import sedd.graphs as g

    return getattr(g, kind)(n)


def rec(label, err, tolerance):
    err = float(err)
    ok = bool(np.isfinite(err) and err <= tolerance)
    return dict(label=label, err=err, tol=float(tolerance), ok=ok)


def states_grid(D, rng):
    """i [B, L] with B = len(SIGMAS), each row a permutation of range(D); sigma [B, 1]."""
    i = np.stack([rng.permutation(D) for _ in SIGMAS])
    sig = np.asarray(SIGMAS)[:, None]
    return i, sig


def as_np(x):
    return np.asarray(jax.device_get(x), dtype=np.float64)


# --------------------------------------------------------------------------
# Deterministic checks
# --------------------------------------------------------------------------
def check_attributes():
    out = []
    for kind, n in GRAPHS:
        g = make_graph(kind, n)
        D = n + 1 if kind == "Absorbing" else n
        out.append(rec(f"{kind}({n}).dim", abs(int(g.dim) - D), 0))
        out.append(rec(f"{kind}({n}).absorb", float(bool(g.absorb) != (kind == "Absorbing")), 0))
    return out


def check_rate():
    """rate(i) == Q[i, :], transp_rate(i) == Q[:, i]; abs error (|Q| <= 1).

    The input is integer only, so the spec leaves the output dtype open; the
    tolerance follows the dtype returned (the label names it)."""
    out = []
    rng = np.random.default_rng(1)
    for kind, n in GRAPHS:
        Q = dense_Q(kind, n)
        D = Q.shape[0]
        g = make_graph(kind, n)
        i, _ = states_grid(D, rng)
        for meth, exp in (("rate", Q[i, :]), ("transp_rate", Q[:, i].transpose(1, 2, 0))):
            got = getattr(g, meth)(ji(i))
            assert got.shape == i.shape + (D,), got.shape
            dt = str(got.dtype)
            out.append(rec(f"{kind}({n}) {meth} [B,L] (returns {dt})", np.abs(as_np(got) - exp).max(), TOL[dt]["exact"]))
        got = g.rate(ji(np.arange(D)))  # 1-D states too
        out.append(rec(f"{kind}({n}) rate [L]", np.abs(as_np(got) - Q).max(), TOL[str(got.dtype)]["exact"]))
    return out


def check_transition():
    """transition(i, sigma) == P[i, :], transp_transition == P[:, i]; abs error (P in [0, 1]),
    i [B, L], sigma [B, 1], one sigma per row b."""
    out = []
    rng = np.random.default_rng(2)
    for kind, n in GRAPHS:
        Q = dense_Q(kind, n)
        D = Q.shape[0]
        g = make_graph(kind, n)
        i, sig = states_grid(D, rng)
        exp_f = np.stack([expm(s * Q)[i[b], :] for b, s in enumerate(SIGMAS)])
        exp_t = np.stack([expm(s * Q)[:, i[b]].T for b, s in enumerate(SIGMAS)])
        got_f = as_np(g.transition(ji(i), jf(sig)))
        got_t = as_np(g.transp_transition(ji(i), jf(sig)))
        assert got_f.shape == (len(SIGMAS), D, D) and got_t.shape == got_f.shape
        for b, s in enumerate(SIGMAS):
            out.append(rec(f"{kind}({n}) transition sigma={s:g}", np.abs(got_f[b] - exp_f[b]).max(), tol("prob")))
            out.append(rec(f"{kind}({n}) transp_transition sigma={s:g}", np.abs(got_t[b] - exp_t[b]).max(), tol("prob")))
    return out


def check_staggered_score():
    """staggered_score(score, dsigma) == expm(-dsigma Q)^T score.
    Error scaled by (|E|^T |score|), the natural magnitude of the product."""
    out = []
    rng = np.random.default_rng(3)
    for kind, n in GRAPHS:
        Q = dense_Q(kind, n)
        D = Q.shape[0]
        g = make_graph(kind, n)
        L = 7
        score = np.exp(rng.normal(0.0, 1.0, size=(len(SIGMAS), L, D)))
        dsig = np.asarray(SIGMAS)[:, None]
        got = as_np(g.staggered_score(jf(score), jf(dsig)))
        assert got.shape == score.shape, got.shape
        for b, s in enumerate(SIGMAS):
            E = expm(-s * Q)
            exp = score[b] @ E  # row l: E^T score[b, l]
            scale = score[b] @ np.abs(E)
            out.append(rec(f"{kind}({n}) staggered dsigma={s:g}", (np.abs(got[b] - exp) / scale).max(), tol("stag")))
    return out


def _score_entropy_inputs(Q, rng, true_ratio):
    """All (x, x0) with P[x0, x] > 0 (same support for every sigma > 0) along L,
    one sigma per row b. log_score[x] = 0."""
    D = Q.shape[0]
    P1 = expm(Q)
    pairs = [(x, x0) for x0 in range(D) for x in range(D) if P1[x0, x] > 0]
    B, L = len(SIGMAS), len(pairs)
    x = np.array([[p[0] for p in pairs]] * B)
    x0 = np.array([[p[1] for p in pairs]] * B)
    log_score = rng.normal(0.0, 1.5, size=(B, L, D))
    if true_ratio:
        for b, s in enumerate(SIGMAS):
            P = expm(s * Q)
            for l, (xx, xx0) in enumerate(pairs):
                r = P[xx0, :] / P[xx0, xx]
                # r = 0 -> s = exp(-1e4) == 0 exactly in float32 and float64
                log_score[b, l] = np.where(r > 0, np.log(np.where(r > 0, r, 1.0)), -1e4)
    for b in range(B):
        log_score[b, np.arange(L), x[b]] = 0.0
    return x, x0, log_score


def check_score_entropy():
    """score_entropy == sum_{y!=x} Q[y,x](s_y - r_y log s_y + K(r_y)) over all (x, x0) with
    P[x0,x] > 0; error scaled by sum_y |Q[y,x]| (|s_y| + |r_y log s_y| + |K(r_y)|).
    Also value >= 0 (to that scale), and == 0 at the true ratios."""
    out = []
    rng = np.random.default_rng(4)
    for kind, n in GRAPHS:
        Q = dense_Q(kind, n)
        g = make_graph(kind, n)
        sig = np.asarray(SIGMAS)[:, None]
        for true_ratio in (False, True):
            x, x0, ls = _score_entropy_inputs(Q, rng, true_ratio)
            got = as_np(g.score_entropy(jf(ls), jf(sig), ji(x), ji(x0)))
            assert got.shape == x.shape, got.shape
            for b, s in enumerate(SIGMAS):
                errs, negs, worst = [], [], None
                for l in range(x.shape[1]):
                    val, scale = dense_score_entropy(Q, s, x[b, l], x0[b, l], np.exp(ls[b, l]))
                    scale = max(scale, 1e-300)
                    e = abs(got[b, l] - val) / scale if np.isfinite(got[b, l]) else np.inf
                    if worst is None or e > worst[0]:
                        worst = (e, int(x[b, l]), int(x0[b, l]), val, got[b, l])
                    errs.append(e)
                    negs.append(max(0.0, -got[b, l]) / scale)
                    if true_ratio:
                        assert abs(val) <= 1e-9 * scale, (val, scale)  # self-check of the reference
                tag = "true ratios (== 0)" if true_ratio else "random score"
                e, xx, xx0, ev, gv = worst
                out.append(rec(f"{kind}({n}) score_entropy {tag} sigma={s:g} "
                               f"[worst x={xx} x0={xx0} expected={ev:.6g} got={gv:.6g}]",
                               max(errs), tol("ratio")))
                if not true_ratio:
                    out.append(rec(f"{kind}({n}) score_entropy >= 0 sigma={s:g}", max(negs), tol("ratio")))
    return out


def check_reverse_rate():
    """reverse_rate(i, score): Q[y, i] s_y off the diagonal, minus their sum on it.
    Error scaled by sum_y |Q[y, i]| s_y."""
    out = []
    rng = np.random.default_rng(5)
    for kind, n in GRAPHS:
        Q = dense_Q(kind, n)
        D = Q.shape[0]
        g = make_graph(kind, n)
        i, _ = states_grid(D, rng)
        score = np.exp(rng.normal(0.0, 1.0, size=i.shape + (D,)))
        got = as_np(g.reverse_rate(ji(i), jf(score)))
        assert got.shape == score.shape, got.shape
        # The graph's own Q entries carry the precision of the dtype rate() returns
        # (float32 even under x64 is allowed, see check_rate), so the error floor
        # is a few ulps of that dtype: formula errors are O(1) and still caught.
        rdt = np.dtype(str(g.rate(ji(np.arange(D))).dtype))
        tolerance = max(tol("stag"), 8 * float(np.finfo(rdt).eps))
        err = 0.0
        for b in range(i.shape[0]):
            for l in range(i.shape[1]):
                exp = dense_reverse_rate(Q, i[b, l], score[b, l])
                scale = max(np.sum(np.abs(Q[:, i[b, l]]) * score[b, l]), 1.0)
                err = max(err, np.abs(got[b, l] - exp).max() / scale)
        out.append(rec(f"{kind}({n}) reverse_rate [B,L] (rate() dtype {rdt})", err, tolerance))
    return out


# --------------------------------------------------------------------------
# Noise schedules
# --------------------------------------------------------------------------
def _noise_cases():
    import sedd.noise as nz

    cases = []
    for smin, smax in ((1e-4, 20.0), (1e-3, 1.0)):
        cases.append((f"Geometric({smin:g},{smax:g})", nz.Geometric(smin, smax),
                      lambda t, a=smin, b=smax: a ** (1 - t) * b ** t,
                      lambda t, a=smin, b=smax: a ** (1 - t) * b ** t * math.log(b / a)))
    for eps in (1e-3, 0.1, None):
        e = 1e-3 if eps is None else eps
        obj = nz.LogLinear() if eps is None else nz.LogLinear(eps)
        name = "LogLinear()" if eps is None else f"LogLinear({eps:g})"
        cases.append((name, obj,
                      lambda t, e=e: -np.log(1 - (1 - e) * t),
                      lambda t, e=e: (1 - e) / (1 - (1 - e) * t)))
    return cases


def check_noise():
    """noise(t) == (formula, derivative formula), scaled by max(|expected|, 1e-2);
    any shape of t; and (float64 only) derivative == central finite difference of
    the implementation's own sigma_bar, relative error."""
    out = []
    t = np.linspace(0.0, 1.0, 21).reshape(3, 7)
    for name, obj, f, df in _noise_cases():
        sig, dsig = obj(jf(t))
        sig, dsig = as_np(sig), as_np(dsig)
        assert sig.shape == t.shape and dsig.shape == t.shape, (sig.shape, dsig.shape)
        out.append(rec(f"{name} sigma_bar(t)", (np.abs(sig - f(t)) / np.maximum(np.abs(f(t)), 1e-2)).max(), tol("noise")))
        out.append(rec(f"{name} dsigma_bar/dt", (np.abs(dsig - df(t)) / np.maximum(np.abs(df(t)), 1e-2)).max(), tol("noise")))
        s0, d0 = obj(jf(0.37))
        assert np.shape(s0) == () and np.shape(d0) == (), (np.shape(s0), np.shape(d0))
        out.append(rec(f"{name} scalar t", abs(float(s0) - f(0.37)) / max(f(0.37), 1e-2), tol("noise")))
        if fdtype() == "float64":
            tt = np.linspace(0.02, 0.98, 25)
            h = 1e-5
            fd = (as_np(obj(jf(tt + h))[0]) - as_np(obj(jf(tt - h))[0])) / (2 * h)
            d = as_np(obj(jf(tt))[1])
            out.append(rec(f"{name} d/dt vs central FD (h=1e-5)", (np.abs(d - fd) / np.abs(fd)).max(), FD_TOL))
    return out


# --------------------------------------------------------------------------
# Sampling (statistical) checks
# --------------------------------------------------------------------------
def _n(full):
    # float64 run repeats the laws with fewer draws (it mainly checks the x64 code path)
    return full if fdtype() == "float32" else full // 4


def _sampling_graphs():
    # each graph costs a compilation of a few seconds; the float64 pass keeps one of each kind
    return GRAPHS if fdtype() == "float32" else (("Uniform", 5), ("Absorbing", 3))


def _row_laws(samples, D):
    samples = np.asarray(samples)
    rows = samples.shape[0]
    flat = samples.reshape(rows, -1)
    assert flat.min() >= 0 and flat.max() < D, (flat.min(), flat.max())
    counts = np.stack([np.bincount(r, minlength=D) for r in flat])
    return counts / flat.shape[1], counts


def check_sample_transition():
    """Empirical law of sample_transition(key, i, sigma) vs P[i, :], every (state, sigma);
    TV <= tv_bound (see its docstring), and no draws where P[i, j] == 0."""
    out = []
    n = _n(100_000)
    key = jax.random.PRNGKey(11)
    for kind, nv in _sampling_graphs():
        Q = dense_Q(kind, nv)
        D = Q.shape[0]
        g = make_graph(kind, nv)
        st = np.repeat(np.arange(D), len(SIGMAS))
        sg = np.tile(np.asarray(SIGMAS), D)
        i = np.broadcast_to(st[:, None], (len(st), n))
        key, sub = jax.random.split(key)
        smp = g.sample_transition(sub, ji(i), jf(sg[:, None]))
        assert smp.shape == i.shape, smp.shape
        assert jnp.issubdtype(smp.dtype, jnp.integer), smp.dtype
        emp, counts = _row_laws(smp, D)
        worst_tv, worst_lab, bad_support = 0.0, "", 0
        for r in range(len(st)):
            P = expm(sg[r] * Q)[st[r]]
            tv = 0.5 * np.abs(emp[r] - P).sum()
            if tv >= worst_tv:
                worst_tv, worst_lab = tv, f"i={st[r]} sigma={sg[r]:g}"
            bad_support += int(counts[r][P == 0].sum())
        out.append(rec(f"{kind}({nv}) sample_transition max TV (n={n}, worst {worst_lab})", worst_tv, tv_bound(D, n)))
        out.append(rec(f"{kind}({nv}) sample_transition draws off the support", bad_support, 0))
    return out


def check_sample_limit():
    out = []
    n = _n(200_000)
    key = jax.random.PRNGKey(12)
    for kind, nv in _sampling_graphs():
        g = make_graph(kind, nv)
        D = nv + 1 if kind == "Absorbing" else nv
        key, sub = jax.random.split(key)
        shape = (8, n // 8)
        smp = g.sample_limit(sub, shape)
        assert tuple(smp.shape) == shape, smp.shape
        assert jnp.issubdtype(smp.dtype, jnp.integer), smp.dtype
        smp = np.asarray(smp)
        if kind == "Absorbing":
            out.append(rec(f"{kind}({nv}) sample_limit: draws != mask", int((smp != nv).sum()), 0))
        else:
            emp, _ = _row_laws(smp.reshape(1, -1), D)
            out.append(rec(f"{kind}({nv}) sample_limit TV vs uniform (n={n})",
                           0.5 * np.abs(emp[0] - 1.0 / D).sum(), tv_bound(D, n)))
    return out


def check_sample_rate():
    """sample_rate(key, i, rate) with rate = dt * reverse_rate (dense, ours): law is
    one_hot(i) + rate. dt per state is c / (-diag), c in (0, 1], including c = 1
    (staying has probability exactly 0)."""
    out = []
    n = _n(100_000)
    key = jax.random.PRNGKey(13)
    rng = np.random.default_rng(6)
    for kind, nv in _sampling_graphs():
        Q = dense_Q(kind, nv)
        D = Q.shape[0]
        g = make_graph(kind, nv)
        probs = np.zeros((D, D))
        for i in range(D):
            score = np.exp(rng.normal(0.0, 1.0, size=D))
            rr = dense_reverse_rate(Q, i, score)
            c = 1.0 if i == D - 1 else rng.uniform(0.2, 0.95)
            dt = c / (-rr[i]) if rr[i] < 0 else 0.0
            probs[i] = dt * rr
        probs_law = probs + np.eye(D)
        probs_law[np.abs(probs_law) < 1e-15] = 0.0
        assert probs_law.min() >= 0 and np.allclose(probs_law.sum(1), 1.0)
        i = np.broadcast_to(np.arange(D)[:, None], (D, n))
        rate = np.broadcast_to(probs[:, None, :], (D, n, D))
        key, sub = jax.random.split(key)
        smp = g.sample_rate(sub, ji(i), jf(rate))
        assert smp.shape == i.shape, smp.shape
        assert jnp.issubdtype(smp.dtype, jnp.integer), smp.dtype
        emp, counts = _row_laws(smp, D)
        tvs = 0.5 * np.abs(emp - probs_law).sum(1)
        out.append(rec(f"{kind}({nv}) sample_rate max TV (n={n}, worst i={int(tvs.argmax())})", tvs.max(), tv_bound(D, n)))
        out.append(rec(f"{kind}({nv}) sample_rate draws off the support", int(counts[probs_law == 0].sum()), 0))
    return out


CHECKS = {
    "attributes": check_attributes,
    "rate": check_rate,
    "transition": check_transition,
    "staggered_score": check_staggered_score,
    "score_entropy": check_score_entropy,
    "reverse_rate": check_reverse_rate,
    "noise": check_noise,
    "sample_transition": check_sample_transition,
    "sample_limit": check_sample_limit,
    "sample_rate": check_sample_rate,
}


def run_check(name):
    try:
        return CHECKS[name]()
    except Exception:  # report, do not hide
        return [dict(label=f"{name}: EXCEPTION\n{traceback.format_exc()}", err=float("inf"), tol=0.0, ok=False)]


def run_all():
    return {name: run_check(name) for name in CHECKS}


def run_float64_subprocess():
    env = dict(os.environ, JAX_ENABLE_X64="1")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--x64-json"],
                       capture_output=True, text=True, env=env, cwd=repo, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"float64 subprocess failed:\n{p.stdout}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# pytest
# --------------------------------------------------------------------------
try:
    import pytest
except ImportError:  # script use without pytest
    pytest = None


def _assert_records(records):
    bad = [r for r in records if not r["ok"]]
    msg = "\n".join(f"{r['label']}: err={r['err']:.3e} tol={r['tol']:.1e}" for r in bad)
    assert not bad, "disagreement:\n" + msg


if pytest is not None:

    @pytest.fixture(scope="module")
    def float64_results():
        return run_float64_subprocess()

    @pytest.mark.parametrize("name", list(CHECKS))
    def test_float32(name):
        if jax.config.jax_enable_x64:
            pytest.skip("x64 enabled in this process; float32 checks need the default")
        _assert_records(run_check(name))

    @pytest.mark.parametrize("name", list(CHECKS))
    def test_float64(name, float64_results):
        _assert_records(float64_results[name])


# --------------------------------------------------------------------------
# script
# --------------------------------------------------------------------------
def _summary(results, dtype):
    ok_all = True
    print(f"\n== {dtype} ==")
    for name, recs in results.items():
        worst = max(recs, key=lambda r: (r["err"] / r["tol"]) if r["tol"] > 0 else (np.inf if r["err"] > 0 else 0.0))
        ok = all(r["ok"] for r in recs)
        ok_all &= ok
        print(f"  {'ok  ' if ok else 'FAIL'} {name:18s} checks={len(recs):3d}  worst err={worst['err']:.3e} "
              f"(tol {worst['tol']:.1e})  {worst['label'].splitlines()[0]}")
        for r in recs:
            if not r["ok"]:
                print(f"       FAIL {r['label']}: err={r['err']:.3e} tol={r['tol']:.1e}")
    return ok_all


def main(argv):
    if "--x64-json" in argv:
        jax.config.update("jax_enable_x64", True)
        print(json.dumps(run_all()))
        return 0
    assert not jax.config.jax_enable_x64, "run the float32 pass without JAX_ENABLE_X64"
    ok32 = _summary(run_all(), "float32 (in process)")
    ok64 = _summary(run_float64_subprocess(), "float64 (jax_enable_x64 subprocess)")
    print("\nALL AGREE" if ok32 and ok64 else "\nDISAGREEMENT (see FAIL lines)")
    return 0 if ok32 and ok64 else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main(sys.argv[1:]))
