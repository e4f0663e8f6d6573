"""The shape of the library: one place that tells model kinds apart, one sampler call, short functions."""

import ast
import functools
import inspect
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from sedd import evaluate, graphs, kinds, losses, noise, sampling

SEDD = Path(__file__).resolve().parents[1] / "sedd"


def _modules():
    for path in sorted(SEDD.rglob("*.py")):
        yield path, ast.parse(path.read_text())


def test_model_kind_is_read_only_by_the_kind_builder():
    """No module outside sedd/kinds/ reads config.model.kind or compares a kind's name."""
    found = []
    for path, tree in _modules():
        if path.parent.name == "kinds":
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Load)
                and node.attr == "kind"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "model"
            ):
                found.append(f"{path.name}:{node.lineno} reads model.kind")
            if isinstance(node, ast.Compare):
                names = [n for n in [node.left, *node.comparators] if isinstance(n, ast.Constant)]
                if any(n.value in kinds.KINDS for n in names) and "kind" in ast.unparse(node):
                    found.append(f"{path.name}:{node.lineno} compares with a kind's name")
            if isinstance(node, ast.Name) and node.id in ("ar_model", "is_ar"):
                found.append(f"{path.name}:{node.lineno} {node.id}")
    assert not found, found


# What `ruff format` (ruff.toml) pushed over the limits below when the tree was first formatted: each at most
# its length then, so none grows, and each to be split until the list is empty (the reader issue, 2026-12-07).
FORMATTED_OVER = {}


def _over(name: str, lines: int, limit: int) -> bool:
    return lines > max(limit, FORMATTED_OVER.get(name, 0))


def test_functions_are_short():
    """No function of sedd/ is longer than 100 lines, but train()'s body (_train_run), whose banner sections read linearly."""
    long = [
        f"{path.name}:{node.name} {node.end_lineno - node.lineno + 1} lines"
        for path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and _over(f"{path.name}:{node.name}", node.end_lineno - node.lineno + 1, 100)
        and (path.name, node.name) != ("train.py", "_train_run")
    ]
    assert not long, long


def test_sample_has_one_signature_and_one_return_type():
    params = inspect.signature(sampling.sample).parameters
    assert len(params) <= 14, list(params)
    assert list(params)[:11] == [
        "key",
        "score_fn",
        "graph",
        "noise",
        "shape",
        "steps",
        "sampler",
        "denoise",
        "eps",
        "fixed_mask",
        "fixed_tokens",
    ]
    graph, sched = graphs.Absorbing(3), noise.LogLinear(1e-3)

    def score_fn(x, sigma):  # any log-score: the shape of the result is what is checked
        return jax.numpy.zeros(x.shape + (graph.dim,))

    for asked in (
        {},
        {"return_stats": True},
        {"return_trajectory": True},
        {"return_stats": True, "return_trajectory": True},
    ):
        out = sampling.sample(jax.random.key(0), score_fn, graph, sched, (2, 4), 3, **asked)
        assert isinstance(out, sampling.Samples) and out.tokens.shape == (2, 4)
        assert (out.stats is not None) == bool(asked.get("return_stats"))
        assert (out.trajectory is not None) == bool(asked.get("return_trajectory"))


def test_options_value_and_keywords_draw_alike():
    """An Options value, the same options as keywords, and keywords over a value: the same draws."""
    graph, sched = graphs.Absorbing(3), noise.LogLinear(1e-3)
    logits = jax.numpy.log(jax.numpy.array([0.5, 0.3, 0.2]))

    def score_fn(x, sigma):  # a product law's absorbing score: p(x0) / (e^sigma - 1) at the tokens
        tokens = logits - graphs.log_expm1(sigma)[:, None, None]
        return jax.numpy.concatenate(
            [jax.numpy.broadcast_to(tokens, x.shape + (3,)), jax.numpy.zeros(x.shape + (1,))], -1
        )

    key = jax.random.key(1)
    kw = sampling.sample(
        key, score_fn, graph, sched, (64, 4), 4, sampler="confidence", order="random", top_p=0.9
    ).tokens
    value = sampling.sample(
        key,
        score_fn,
        graph,
        sched,
        (64, 4),
        4,
        sampler="confidence",
        options=sampling.Options.make(order="random", top_p=0.9),
    ).tokens
    over = sampling.sample(
        key,
        score_fn,
        graph,
        sched,
        (64, 4),
        4,
        sampler="confidence",
        options=sampling.Options.make(order="random", top_p=0.5),
        top_p=0.9,
    ).tokens
    np.testing.assert_array_equal(kw, value)
    np.testing.assert_array_equal(kw, over)
    with pytest.raises(ValueError, match="takes no option"):
        sampling.Options.make(order="random").checked("analytic", graph)


def test_an_unknown_kind_names_the_registered_ones():
    from sedd import config as config_lib

    c = config_lib.load_config("tiny")
    c.vocab_size = 5
    c.model.kind = "diffusion"
    with pytest.raises(ValueError, match="unknown model.kind 'diffusion'; expected one of 'ddit', 'ar'"):
        kinds.get(c)


def _imported_modules(tree) -> dict[str, str]:
    """Local name -> module, for every ``import sedd.x as y`` / ``from sedd import x`` / ``from sedd.x import y`` of a module."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("sedd"):
                    names[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sedd"):
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def test_no_module_uses_another_modules_private_name():
    """No module of sedd/ imports or reaches another module's underscore name (a shared helper is public)."""
    found = []
    for path, tree in _modules():
        where = path.relative_to(SEDD.parent)
        modules = _imported_modules(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sedd"):
                found += [
                    f"{where}:{node.lineno} from {node.module} import {a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
            ):
                found.append(f"{where}:{node.lineno} {node.value.id}.{node.attr}")
    assert not found, found


def test_files_are_short():
    """One concept a file: no file of sedd/ over 600 lines."""
    long = [
        f"{path.relative_to(SEDD.parent)} {len(path.read_text().splitlines())} lines"
        for path, _ in _modules()
        if _over(str(path.relative_to(SEDD.parent)), len(path.read_text().splitlines()), 600)
    ]
    assert not long, long


EXPERIMENTS = SEDD.parent / "experiments"


def _experiments():
    for path in sorted(EXPERIMENTS.rglob("*.py")):
        yield path.relative_to(SEDD.parent), ast.parse(path.read_text())


def test_experiments_ask_the_kind_instead_of_its_name():
    """A study or benchmark asks a run's kind what it does (``label``, ``diffuses``, ``one_token_steps``, ``exact``,
    its capabilities, ``conditions``): it never reads a kind's name nor compares a kind's name with anything.

    Building a config of a kind (``config.model.kind = "ar"`` to train a baseline) sets a value and is fine.
    """
    found = []
    for where, tree in _experiments():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "name"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "kind"
            ):
                found.append(f"{where}:{node.lineno} reads {ast.unparse(node)}")
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                named = any(isinstance(n, ast.Constant) and n.value in kinds.KINDS for n in sides)
                if named and "kind" in ast.unparse(node):  # x.model.kind == "ar", r["kind"] != "ddit", ...
                    found.append(f"{where}:{node.lineno} compares with a kind's name: {ast.unparse(node)}")
                if any(
                    isinstance(n, ast.Attribute)
                    and n.attr == "kind"
                    and isinstance(n.value, ast.Attribute)
                    and n.value.attr == "model"
                    for n in sides
                ):
                    found.append(f"{where}:{node.lineno} compares config.model.kind: {ast.unparse(node)}")
    assert not found, found


def test_experiments_change_no_import_path():
    """experiments/ is a package whose scripts import its modules by name: nothing there reads or edits sys.path."""
    found = [
        f"{where}:{node.lineno} {ast.unparse(node)}"
        for where, tree in _experiments()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys"
    ]
    assert not found, found
    assert (EXPERIMENTS / "__init__.py").exists() and (EXPERIMENTS / "benchmarks" / "__init__.py").exists()


def test_experiment_files_are_short():
    """One benchmark a file, one study a file: no file of experiments/ over 700 lines, no function over 100."""
    long = [
        f"{where} {n} lines"
        for where, tree in _experiments()
        if _over(str(where), n := len((SEDD.parent / where).read_text().splitlines()), 700)
    ]
    long += [
        f"{where}:{node.name} {node.end_lineno - node.lineno + 1} lines"
        for where, tree in _experiments()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and _over(f"{where}:{node.name}", node.end_lineno - node.lineno + 1, 100)
    ]
    assert not long, long


def test_serve_and_the_cli_name_no_kind_and_serve_no_sampler():
    """`sedd serve` and the `sedd` command ask the run's kind, and for what only some kinds can do its
    capability (``sedd.kinds.capabilities``): no kind's name, class or property appears in them, and no
    sampler's in serve."""
    kind_names = set(kinds.KINDS) | {k.__name__ for k in kinds.KINDS.values()}
    kind_names |= {"prefix_only", "block_size", "block", "speculates", "choose_layout", "layout_of"}
    names = kind_names | set(sampling.SAMPLERS) | {"ReMDM"} | {type(s).__name__ for s in sampling.SAMPLERS.values()}
    found = []
    cli = ast.parse((SEDD / "cli.py").read_text())
    for node in ast.walk(cli):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in kind_names:
            found.append(f"cli.py:{node.lineno} the string {node.value!r}")
        if (
            isinstance(node, ast.Name)
            and node.id in kind_names
            or isinstance(node, ast.Attribute)
            and node.attr in kind_names
        ):
            found.append(f"cli.py:{node.lineno} {ast.unparse(node)}")
    for path in sorted((SEDD / "serve").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append(f"{path.name}:{node.lineno} the string {node.value!r}")
            if (
                isinstance(node, ast.Name)
                and node.id in names
                or isinstance(node, ast.Attribute)
                and node.attr in names
            ):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "isinstance"
                and any(m in ast.unparse(node.args[1]) for m in ("sampling.", "kinds.", "block."))
            ):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [f"{node.module}.{a.name}" for a in node.names]
                )  # what is bound: sedd.kinds.capabilities is not a kind
                found += [
                    f"{path.name}:{node.lineno} imports {m}"
                    for m in mods
                    if m.startswith(("sedd.block", "sedd.ar", "sedd.model", "sedd.kinds"))
                    and m != "sedd.kinds.capabilities"
                ]
    assert not found, found


PROTOCOL = {
    "conditions",
    "reads",
    "label",
    "describe",
    "network",
    "params_from",
    "loss",
    "likelihood",
    "sample",
    "check_sampler",
    "check_options",
    "settles",
    "unwritten_id",
}
"""What every kind is: ``kinds.Kind``'s own members (and its name and config)."""


def _capabilities() -> list[type]:
    return [
        c
        for c in vars(kinds.capabilities).values()
        if isinstance(c, type) and c.__module__ == kinds.capabilities.__name__
    ]


def _declared(cls: type) -> set[str]:
    """The public members a class states: its attributes, methods and annotated attributes."""
    return {n for n in [*vars(cls), *getattr(cls, "__annotations__", {})] if not n.startswith("_")}


def test_the_kind_protocol_is_what_every_kind_is():
    """``Kind`` names what every kind is (network, loss, likelihood, sampling, description, the checks of its
    options); what only some kinds can do is a capability of ``sedd.kinds.capabilities`` (among them what a kind
    that diffuses or is exact promises: ``Diffuses`` graph, noise, one_token_steps; ``Exact`` sequence_nll), which
    the base class does not derive from, and every capability is one at least one registered kind has."""
    own = {n for n in vars(kinds.Kind) if not n.startswith("_")} - {"config"}
    assert own == PROTOCOL, own ^ PROTOCOL
    caps = {c.__name__: c for c in _capabilities()}
    assert set(caps) == {"Diffuses", "Exact", "ServesLanes", "Speculates", "Drafts", "Distills", "Tunes"}, set(caps)
    assert {"graph", "noise", "one_token_steps"} <= _declared(caps["Diffuses"])
    assert "sequence_nll" in _declared(caps["Exact"]) and "layout" in _declared(caps["Tunes"])
    for cap in caps.values():
        assert not issubclass(kinds.Kind, cap)
        assert any(issubclass(k, cap) for k in kinds.KINDS.values()), cap


def _kind_reads(tree) -> list[tuple[int, str]]:
    """(line, member) of every `X.kind.member` and `kind.member` read in a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            v = node.value
            if (isinstance(v, ast.Attribute) and v.attr == "kind") or (isinstance(v, ast.Name) and v.id == "kind"):
                found.append((node.lineno, node.attr))
    return found


def test_every_member_read_of_a_kind_outside_the_kinds_is_declared():
    """What code outside sedd/kinds reads of a kind (``run.kind.x``, ``kind.x``: sedd/, experiments/) is a member
    ``Kind`` declares or one a capability declares, so that a new kind learns what it owes from the protocol and
    the capabilities, never from another kind's module."""
    declared = PROTOCOL | {"name", "config"} | set().union(*map(_declared, _capabilities())) - {"verb"}
    paths = [p for p in sorted(SEDD.rglob("*.py")) if p.parent.name != "kinds"] + sorted(EXPERIMENTS.rglob("*.py"))
    found = [
        f"{path.relative_to(SEDD.parent)}:{line} kind.{member}"
        for path in paths
        for line, member in _kind_reads(ast.parse(path.read_text()))
        if member not in declared
    ]
    assert not found, found


class _LeftToRight(sampling.AbsorbingSampler):
    """A toy sampler, registered by a test: unmask the leftmost ceil(masked / steps left) masked positions."""

    def step(self, ctx, key, carry, n, t, t_next):
        log_score, carry = ctx.evaluate(carry, ctx.noise(t)[0])
        x = carry["x"]
        token, _ = ctx.draw(key, log_score[..., : ctx.graph.vocab_size])  # (B, L)
        masked = x == ctx.graph.mask
        order = jax.numpy.cumsum(masked, axis=-1)  # 1 at the leftmost masked position, 2 at the next, ...
        k = (masked.sum(-1) + ctx.steps - n - 1) // (ctx.steps - n)  # (B,)
        return dict(carry, x=jax.numpy.where(masked & (order <= k[:, None]), token, x))


@pytest.fixture
def toy_sampler():
    name = "toy_left_to_right"
    sampling.register_sampler(name)(_LeftToRight)
    try:
        yield name
    finally:
        del sampling.SAMPLERS[name]


@pytest.mark.parametrize("kind", ["ddit", "block"])
def test_a_sampler_registered_here_is_driven_by_every_kind_and_served(kind, toy_sampler):
    """A new sampler touches its own module only: the kinds drive it and `sedd serve` serves it, unchanged."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from sedd import serve
    from test_golden import _cached_run

    run = _cached_run(kind)
    out = run.sample(jax.random.key(0), 2, steps=4, sampler=toy_sampler, return_trajectory=True)
    tokens, traj = np.asarray(out.tokens), np.asarray(out.trajectory)
    assert tokens.shape == (2, run.seq_len) and tokens.max() < run.config.vocab_size  # no mask left
    mask = run.graph.mask
    for state in traj.reshape(-1, run.seq_len):  # left to right: no token after a masked position of its part
        part = state.reshape(-1, run.config.model.block_size)[0] if kind == "block" else state
        assert not np.any((part[1:] != mask) & np.cumsum(part == mask)[:-1].astype(bool)), part
    app = serve.create_app(run, "toy", serve.Limits(max_steps=8, window_s=0.0))
    with TestClient(app, base_url="http://localhost") as client:
        body = {"prompt": "ab", "max_tokens": 6, "steps": 3, "sampler": toy_sampler, "seed": 1, "n": 2}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        texts = [c["text"] for c in r.json()["choices"]]
        assert all(len(t) == 6 for t in texts), texts
        frames = [
            e
            for e in client.post("/v1/completions", json={**body, "diffusing": True}).text.split("\n")
            if e.startswith("data:") and "[DONE]" not in e
        ]
        assert len(frames) > 1


class _MaskedUnigram(kinds.Kind, kinds.capabilities.Diffuses, kinds.capabilities.Exact):
    """A toy kind registered by a test (the "add a kind" dry run of docs/architecture.md): a diffusing kind on the
    absorbing graph whose network sees no context (its input all MASK), so each position's law p(y) is its whole
    model: the score at a masked position p(y) / (e^sigma - 1) (the network's normalized output), the denoising
    score entropy its loss, any absorbing sampler its sampler, and -sum_l log p(x_l) its exact NLL. It imports the
    protocol, the capabilities and the math, and nothing of another kind."""

    conditions = ("prefix", "suffix", "infill")

    def __init__(self, config):
        super().__init__(config)
        self.graph, self.noise = kinds.build_graph(config), kinds.build_noise(config)

    def one_token_steps(self, length):
        return length

    def network(self, seed=0):
        d = self.graph.dim
        return kinds.network_of(
            self.config,
            seed,
            num_tokens=d,
            out_dim=d,
            scale_by_sigma=True,
            causal=False,
            time_conditioning=False,
            normalize=True,
        )

    def _score(self, model, x, sigma, **net):  # (B, L, D): the network over MASKs, scored at x
        return model.log_score(model.network_output(jax.numpy.full_like(x, self.graph.mask), sigma, **net), x, sigma)

    def loss(self, key, model, x0, train, rngs=None):
        score = functools.partial(self._score, model, deterministic=not train, rngs=rngs)
        return losses.loss_fn(key, score, self.graph, self.noise, x0, sampling_eps=1e-3)

    def sequence_nll(self, net):
        v, model = self.config.vocab_size, net.model

        def nll(x0):  # -sum_l log p(x0_l), p the law over the V tokens at every position (no sigma read)
            out = model.network_output(jax.numpy.full_like(x0, self.graph.mask), jax.numpy.ones(x0.shape[:1]))[..., :v]
            return -jax.numpy.take_along_axis(jax.nn.log_softmax(out, -1), x0[..., None], -1)[..., 0].sum(-1)

        return jax.jit(nll)

    def likelihood(self, key, net, batches, num_t, *, max_batches=None, chars_per_token=None, progress=False, **kwargs):
        nll = self.sequence_nll(net)
        return evaluate.dataset_nll(
            nll, batches, max_batches=max_batches, chars_per_token=chars_per_token, progress=progress
        )

    def check_sampler(self, name):
        super().check_sampler(name)
        sampling.check_graph(name, self.graph)

    def sample(self, key, net, num_samples, steps=None, sampler=None, **options):
        s = self.config.sampling
        shape, graphdef = (num_samples, self.config.data.seq_len), net.graphdef
        score = lambda state, x, sigma: self._score(nnx.merge(graphdef, *state), x, sigma)  # noqa: E731
        return sampling.sample(
            key,
            score,
            self.graph,
            self.noise,
            shape,
            s.steps if steps is None else steps,
            sampler or s.sampler,
            score_params=net.state,
            **options,
        )


def test_a_kind_registered_here_trains_evaluates_samples_and_is_refused_by_serve(tiny_run, tmp_path, capsys):
    """A new diffusing kind touches its module (here, this test), one registry line, its config value and its
    test: `sedd train`'s loop, its exact NLL (and as a judge of samples), `sedd sample` with steps and an infill,
    and `sedd eval` take it unchanged, and `sedd serve`, which serves only kinds with a serving capability,
    refuses it in one line naming the kinds that have one."""
    from sedd import cli, config as config_lib, figures, runs, serve, train

    kinds.register("toy_masked_unigram")(_MaskedUnigram)
    run = tmp_path / "run"
    try:
        config = config_lib.load_config(
            "tiny",
            [
                f"--config.data.data_dir={tiny_run[1]}",
                "--config.model.n_layers=1",
                "--config.model.kind=toy_masked_unigram",
                "--config.training.n_iters=4",
                "--config.training.eval_every=4",
                "--config.training.ckpt_every=4",
                "--config.training.eval_samples=0",
            ],
        )
        out = train.train(config, run, quiet=True)
        assert out["bound"]["kind"] == "toy_masked_unigram" and out["bound"]["stderr_nats_per_token"] == 0.0
        assert 0 < out["bound"]["nats_per_token"] < 6
        assert cli.main(["sample", "--workdir", str(run), "--num_samples", "2", "--steps", "4"]) == 0
        assert capsys.readouterr().out.count("--- sample ") == 2
        assert cli.main(["sample", "--workdir", str(run), "--steps", "4", "--infill", "ab__cd"]) == 0
        assert capsys.readouterr().out.split("--- sample 0\n")[1].startswith("ab")
        assert cli.main(["eval", "--workdir", str(run), "--max_batches", "1"]) == 0
        assert "nats_per_token" in capsys.readouterr().out
        loaded = runs.load(run)
        assert figures.judge_nll(loaded)(np.zeros((2, loaded.seq_len), np.int32)).shape == (2,)  # a judge of samples
        with pytest.raises(
            ValueError,
            match="sedd serve: a model.kind='toy_masked_unigram' run cannot be served lane by "
            "lane; model.kind 'ddit' or 'block' can",
        ):
            serve.create_app(loaded, "toy")
    finally:
        del kinds.KINDS["toy_masked_unigram"]
