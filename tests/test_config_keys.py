"""Config keys: every key sedd/ reads exists in every shipped config, and old run directories still load.

The reads are found by walking the AST of every module of sedd/: attribute chains rooted at a
config (``config.x.y``, ``self.config.x``, ``run.config.x``), at a section alias (``t`` after
``t = config.training``, or ``m, v = config.model, config.vocab_size``), or at a parameter that
a call site passes a config or a section (``load_dataset(config.data)`` makes ``load_dataset``'s
first parameter the data section), with ``["k"]``, ``getattr(c, "k")``, ``.get("k", ...)``,
``"k" in c`` and ``hasattr(c, "k")`` on them. A read with a fallback (``.get``, getattr with a
default, ``in``, hasattr) or a key no constant gives is refused: it would hide a key that a
config lacks. A run written before a key existed is upgraded once, by ``sedd.config.migrate``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from sedd import config as config_lib
from sedd import runs
from sedd.data import EOS_TEXT

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "run_v0_1_0"

# Filled in at training from the data, so in every run's config.json and in no shipped config.
FILLED_IN = {"vocab_size"}
# Methods of a ConfigDict or a dict: an attribute chain ends at them.
METHODS = frozenset(n for n in {*dir(ml_collections.ConfigDict), *dir(dict)} if not n.startswith("__"))
# Calls that return a whole config, and calls that return (a copy of) their first argument.
ROOT_CALLS = {"load_config", "read_config", "from_json", "migrate", "get_config", "_run_config_file"}
SAME_CALLS = {"ConfigDict", "FrozenConfigDict", "deepcopy", "override", "data_section"}
# Names whose `.config` is not a sedd config: jax's flags, argparse's namespace, absl's
# FlagValues, and a conversion source (sedd.convert), whose config is the original's.
NOT_A_CONFIG = {"jax", "args", "values", "source"}
# Modules that walk every key generically (the config machinery itself).
GENERIC = {"sedd/config.py"}
FALLBACKS = {"get", "pop", "setdefault", "getattr", "in", "hasattr", "dynamic"}


def _keys(c, prefix=""):
    """Every dotted key of a config, sections included."""
    out = set()
    for k, v in c.items():
        out.add(f"{prefix}{k}")
        if hasattr(v, "items"):
            out |= _keys(v, f"{prefix}{k}.")
    return out


@dataclasses.dataclass(frozen=True)
class Read:
    where: str  # module:line
    key: str  # dotted; "?" where no constant gives it
    how: str  # attr | subscript | getattr | get | pop | setdefault | in | hasattr | dynamic (no constant key)

    def __str__(self):
        return f"{self.where}: {self.key} ({self.how})"


class _Walker:
    """Reads of config keys in modules, in source order, with aliases and section parameters.

    A value is described by the set of config paths it may hold (tuples of keys; () is a
    whole config). Parameters get the paths their call sites pass (found over repeated passes,
    matched by function name), a parameter named `config` without one is a whole config.
    """

    def __init__(self, sections: set[tuple], leaves: set[tuple], params: dict | None = None):
        self.sections, self.leaves = sections, leaves
        self.params = params or {}  # (function name, position or keyword) -> paths passed there
        self.calls: dict = {}  # the same, found in this pass
        self.reads: list[Read] = []
        self.where = ""
        self.consts: dict[str, tuple] = {}

    # ---- scopes and statements

    def module(self, tree: ast.Module, name: str) -> None:
        self.where = name
        self.consts = {}
        for node in tree.body:  # module constants of strings: MESH_AXES = ("data", "fsdp", "tensor")
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and (strings := _strings(node.value)) is not None:
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Name):
                        self.consts[t.id] = strings
        self.block(tree.body, {})

    def block(self, body, env: dict) -> None:
        for node in body:
            self.stmt(node, env)

    def stmt(self, node, env: dict) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
                if d is not None:
                    self.expr(d, env)
            self.block(node.body, self._function_env(node, env))
        elif isinstance(node, ast.ClassDef):
            for d in [*node.decorator_list, *node.bases]:
                self.expr(d, env)
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    item._sedd_name = node.name  # `Trainer(config)` calls Trainer.__init__
            self.block(node.body, dict(env))
        elif isinstance(node, ast.Assign):
            value = self.expr(node.value, env)
            for t in node.targets:
                self.bind(t, node.value, value, env)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.bind(node.target, node.value, self.expr(node.value, env), env)
        elif isinstance(node, ast.AugAssign):  # x.k += 1 reads x.k
            self.expr(node.value, env)
            self.expr(node.target, env)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.expr(node.iter, env)
            self.bind_loop(node.target, node.iter, env)
            self.block(node.body, env)
            self.block(node.orelse, env)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self.expr(item.context_expr, env)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, None, frozenset(), env)
            self.block(node.body, env)
        else:  # if / while / try / return / expressions ...: their expressions, then their blocks
            for _, value in ast.iter_fields(node):
                if isinstance(value, ast.expr):
                    self.expr(value, env)
                elif isinstance(value, list):
                    for v in value:
                        if isinstance(v, ast.stmt):
                            self.stmt(v, env)
                        elif isinstance(v, ast.expr):
                            self.expr(v, env)
                        elif isinstance(v, ast.excepthandler):
                            self.block(v.body, env)
                        elif isinstance(v, ast.match_case):
                            self.block(v.body, env)

    def _function_env(self, node, env: dict) -> dict:
        env = dict(env)
        args = [*node.args.posonlyargs, *node.args.args]
        shift = 1 if args and args[0].arg in ("self", "cls") else 0
        name = getattr(node, "_sedd_name", node.name)
        for i, a in enumerate([*args, *node.args.kwonlyargs]):
            passed = self.params.get((name, a.arg), frozenset())
            if i < len(args):
                passed |= self.params.get((name, i - shift), frozenset())
            env[a.arg] = passed or (frozenset({()}) if a.arg == "config" else frozenset())
        for a in (node.args.vararg, node.args.kwarg):
            if a is not None:
                env[a.arg] = frozenset()
        return env

    def bind(self, target, value_node, value: frozenset, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            parts = value_node.elts if isinstance(value_node, (ast.Tuple, ast.List)) else None
            for i, t in enumerate(target.elts):
                # m, v = config.model, config.vocab_size: element by element
                self.bind(
                    t,
                    None,
                    self.expr(parts[i], env, record=False) if parts and len(parts) == len(target.elts) else frozenset(),
                    env,
                )
        elif isinstance(target, ast.Attribute):  # config.vocab_size = ...: a store, not a read
            self.expr(target.value, env)
        elif isinstance(target, ast.Subscript):
            self.expr(target.value, env)
            self.expr(target.slice, env)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, None, frozenset(), env)

    def bind_loop(self, target, iterable, env: dict) -> None:
        strings = _strings(iterable)
        if strings is None and isinstance(iterable, ast.Name):
            strings = self.consts.get(iterable.id)
        names = [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
        for n in names:
            env[n] = frozenset()
            env.pop(("const", n), None)
        if strings is not None and isinstance(target, ast.Name):  # for a in MESH_AXES: c[a] reads each
            env[("const", target.id)] = strings

    # ---- expressions: the config paths a value may hold, and the reads on the way

    def expr(self, node, env: dict, record: bool = True) -> frozenset:
        saved = self.reads
        if not record:
            self.reads = []
        try:
            return self._expr(node, env)
        finally:
            self.reads = saved

    def _expr(self, node, env: dict) -> frozenset:
        if isinstance(node, ast.Name):
            return env.get(node.id, frozenset())
        if isinstance(node, ast.Attribute):
            owner = self._expr(node.value, env)
            if (
                node.attr == "config"
                and not owner
                and not (isinstance(node.value, ast.Name) and node.value.id in NOT_A_CONFIG)
            ):
                return frozenset({()})  # self.config, run.config, judge.config
            return self.step(owner, node.attr, "attr", node)
        if isinstance(node, ast.Subscript):
            base = self._expr(node.value, env)
            self._expr(node.slice, env)
            if not self.is_section(base):
                return frozenset()
            return self.step(base, self.key(node.slice, env), "subscript", node)
        if isinstance(node, ast.Call):
            return self.call(node, env)
        if isinstance(node, ast.Compare):
            self._expr(node.left, env)
            for op, right in zip(node.ops, node.comparators):
                paths = self._expr(right, env)
                if isinstance(op, (ast.In, ast.NotIn)) and self.is_section(paths):
                    self.step(paths, self.key(node.left, env), "in", node)
            return frozenset()
        if isinstance(node, ast.IfExp):
            self._expr(node.test, env)
            return self._expr(node.body, env) | self._expr(node.orelse, env)
        if isinstance(node, ast.BoolOp):
            return frozenset().union(*(self._expr(v, env) for v in node.values))
        if isinstance(node, ast.NamedExpr):
            value = self._expr(node.value, env)
            env[node.target.id] = value
            return value
        if isinstance(node, ast.Lambda):
            inner = dict(env)
            for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                inner[a.arg] = frozenset()
            self._expr(node.body, inner)
            return frozenset()
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = dict(env)
            for gen in node.generators:
                self._expr(gen.iter, inner)
                self.bind_loop(gen.target, gen.iter, inner)
                for cond in gen.ifs:
                    self._expr(cond, inner)
            for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
                self._expr(part, inner)
            return frozenset()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self._expr(child, env)
            elif isinstance(child, ast.keyword):
                self._expr(child.value, env)
            elif isinstance(child, ast.comprehension):
                self._expr(child.iter, env)
        return frozenset()

    def call(self, node: ast.Call, env: dict) -> frozenset:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        args = [self._expr(a, env) for a in node.args]
        kwargs = {k.arg: self._expr(k.value, env) for k in node.keywords}
        for key, paths in [*enumerate(args), *kwargs.items()]:
            if paths and name is not None:
                self.calls[(name, key)] = self.calls.get((name, key), frozenset()) | paths
        if isinstance(func, ast.Attribute):
            owner = self._expr(func.value, env)
            if self.is_section(owner):
                if func.attr in ("get", "pop", "setdefault") and node.args:
                    self.step(owner, self.key(node.args[0], env), func.attr, node)
                    return frozenset()
                if func.attr in ("to_dict", "copy_and_resolve_references"):
                    return owner
                return frozenset()
        elif name in ("getattr", "hasattr") and len(args) >= 2 and self.is_section(args[0]):
            key = self.key(node.args[1], env)
            if name == "hasattr" and key in METHODS:
                return frozenset()
            how = "attr" if name == "getattr" and len(args) == 2 else "getattr" if name == "getattr" else "hasattr"
            return self.step(args[0], key, how, node)
        if name in ROOT_CALLS:
            return frozenset({()})
        if name in SAME_CALLS and args:
            return args[0]
        return frozenset()

    def key(self, node, env: dict):
        """The constant key(s) of a subscript, get, getattr or `in`: a str, a tuple of str, or None."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return env.get(("const", node.id))
        return None

    def is_section(self, paths: frozenset) -> bool:
        return any(p in self.sections for p in paths)

    def step(self, paths: frozenset, key, how: str, node) -> frozenset:
        """The paths `key` leads to from `paths`, recording each read."""
        out = set()
        for p in paths:
            if p not in self.sections:  # a leaf's own methods (a str's .split, ...)
                continue
            if key is None:
                self.reads.append(Read(f"{self.where}:{node.lineno}", ".".join([*p, "?"]), "dynamic"))
                continue
            for k in (key,) if isinstance(key, str) else key:
                if how == "attr" and k in METHODS:
                    continue
                path = (*p, k)
                self.reads.append(Read(f"{self.where}:{node.lineno}", ".".join(path), how))
                if path in self.sections or path in self.leaves:
                    out.add(path)
        return frozenset(out)


def _strings(node):
    """The strings of a literal tuple or list of string constants, else None."""
    if (
        isinstance(node, (ast.Tuple, ast.List))
        and node.elts
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    ):
        return tuple(e.value for e in node.elts)
    return None


def _paths(c, prefix=()):
    sections, leaves = {prefix}, set()
    for k, v in c.items():
        if isinstance(v, dict):
            s, l_ = _paths(v, (*prefix, k))
            sections |= s
            leaves |= l_
        else:
            leaves.add((*prefix, k))
    return sections, leaves


def config_reads(sources: dict[str, str], default: dict) -> list[Read]:
    """Every read of a config key in `sources` (module name -> text), `default` giving the schema."""
    sections, leaves = _paths(default)
    leaves |= {(k,) for k in FILLED_IN}
    trees = {name: ast.parse(text) for name, text in sources.items()}
    params = {}
    for _ in range(20):  # until the parameters that receive configs stop changing
        walker = _Walker(sections, leaves, params)
        for name, tree in trees.items():
            walker.module(tree, name)
        if walker.calls == params:
            return walker.reads
        params = walker.calls
    raise AssertionError("the config parameters did not settle")


def _sedd_sources() -> dict[str, str]:
    return {
        p.relative_to(ROOT).as_posix(): p.read_text()
        for p in sorted((ROOT / "sedd").rglob("*.py"))
        if p.relative_to(ROOT).as_posix() not in GENERIC
    }


# --------------------------------------------------------------------------- the keys the code reads


def test_the_walker_finds_reads_through_aliases_section_parameters_and_fallbacks():
    default = {
        "model": {"n_heads": 8, "kind": "ddit"},
        "mesh": {"data": -1, "fsdp": 1},
        "data": {"seq_len": 8, "markov": {"order": 2}},
    }
    source = textwrap.dedent("""
        AXES = ("data", "fsdp")
        def build(config):
            m, v = config.model, config.vocab_size
            if m.kind.upper() == "AR" and "n_heads" in m:
                return m.get("dropout", 0.0), load(config.data), shape(config.mesh)
            return getattr(m, "n_heads"), config["mesh"]["fsdp"], m.nope
        def load(section):
            return section.markov.order, section.seq_len
        def shape(mesh_config):
            return [mesh_config[a] for a in AXES]
        def other(config):
            config = read_original(config)
            return config.anything
        class Run:
            def use(self):
                return self.config.model.kind, args.config.model, getattr(self.config.data, name, 0)
    """)
    reads = {(r.key, r.how) for r in config_reads({"m.py": source}, default)}
    assert reads == {
        ("model", "attr"),
        ("vocab_size", "attr"),
        ("model.kind", "attr"),
        ("model.n_heads", "in"),
        ("model.dropout", "get"),
        ("data", "attr"),
        ("mesh", "attr"),
        ("data.markov", "attr"),
        ("data.markov.order", "attr"),
        ("data.seq_len", "attr"),
        ("mesh.data", "subscript"),
        ("mesh.fsdp", "subscript"),
        ("model.n_heads", "attr"),
        ("mesh", "subscript"),
        ("model.nope", "attr"),
        ("data.?", "dynamic"),
    }


def test_every_key_the_code_reads_exists_in_every_shipped_config():
    """Each key sedd/ reads is in the default config, read without a fallback; all shipped configs have one key set."""
    names = config_lib.shipped_configs()
    assert {"shakespeare_char", "tiny", "text8", "owt_small", "markov"} <= set(names)
    configs = {n: config_lib.load_config(n) for n in names}
    default = configs[config_lib.DEFAULT_CONFIG]
    keys = _keys(default)
    assert not keys & METHODS, "a config key named like a ConfigDict method cannot be read as an attribute"
    reads = config_reads(_sedd_sources(), default.to_dict())
    # The walker sees each kind of module: a sample of the reads it must find.
    found = {r.key for r in reads}
    assert {
        "training.ema",
        "optim.lr",
        "mesh.cpu_devices",
        "mesh.data",
        "data.markov.order",
        "sampling.sampler",
        "model.hidden_size",
        "noise.eps",
    } <= found, sorted(found)
    missing = [str(r) for r in reads if r.key not in keys | FILLED_IN and r.how != "dynamic"]
    assert not missing, "the code reads keys no shipped config defines:\n" + "\n".join(missing)
    fallbacks = [str(r) for r in reads if r.how in FALLBACKS]
    assert not fallbacks, (
        "config keys read with a fallback that hides a missing key, or by a key no constant "
        "names (read them as attributes; sedd.config.migrate fills old runs):\n" + "\n".join(fallbacks)
    )
    for name, c in configs.items():
        assert _keys(c) == keys, f"{name} differs from the default config: {_keys(c) ^ keys}"


# --------------------------------------------------------------------------- old configs


def _leaves(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_migrate_fills_missing_keys_with_what_old_runs_did_and_drops_removed_ones():
    shipped = config_lib.load_config(config_lib.DEFAULT_CONFIG).to_dict()
    assert set(config_lib.BEFORE_IT_EXISTED) <= set(_leaves(shipped))
    saved = config_lib.load_config("tiny", ["--config.optim.optimizer=adamw"]).to_dict()
    saved["vocab_size"] = 85
    assert config_lib.migrate(saved).to_dict() == saved  # a current config is kept as it is
    del saved["training"]["t_power"], saved["optim"]["optimizer"], saved["model"]["normalize"]
    del saved["optim"]["muon_lr_scale"], saved["data"]["markov"]
    saved["optim"]["removed_key"] = 1
    saved["removed_section"] = {"a": 1}
    migrated = config_lib.migrate(saved)
    assert isinstance(migrated, ml_collections.ConfigDict)
    assert _keys(migrated) == _keys(shipped) | {"vocab_size"}
    assert migrated.training.t_power == 0.0 and migrated.optim.optimizer == "adamw"
    assert migrated.model.normalize is False
    assert migrated.optim.muon_lr_scale == shipped["optim"]["muon_lr_scale"]  # no BEFORE_IT_EXISTED value
    assert migrated.data.markov.to_dict() == shipped["data"]["markov"]  # a whole missing section
    assert migrated.model.hidden_size == saved["model"]["hidden_size"] != shipped["model"]["hidden_size"]
    assert migrated.vocab_size == 85
    assert config_lib.migrate(migrated).to_dict() == migrated.to_dict()


def _old_run(tmp_path) -> Path:
    """The fixture copied, with keys deleted from its config.json as a run older still would lack them."""
    workdir = tmp_path / "run"
    shutil.copytree(FIXTURE, workdir)
    saved = json.loads((workdir / runs.CONFIG).read_text())
    del saved["training"]["t_power"], saved["optim"]["optimizer"], saved["optim"]["adaln_lr_scale"]
    del saved["model"]["normalize"], saved["model"]["time_conditioning"], saved["mesh"]["cpu_devices"]
    (workdir / runs.CONFIG).write_text(json.dumps(saved))
    return workdir


def test_a_run_of_the_previous_release_lacking_newer_keys_loads_and_samples(tmp_path):
    workdir = _old_run(tmp_path)
    config = runs.read_config(workdir)
    assert config.training.t_power == 0.0 and config.optim.optimizer == "adamw"
    assert config.optim.adaln_lr_scale == 1.0 and config.model.normalize is False
    assert config.model.time_conditioning is True and config.mesh.cpu_devices == 0
    run = runs.load(workdir)
    assert run.step == 2
    V, L = run.config.vocab_size, run.seq_len
    x = (jnp.arange(2 * L, dtype=jnp.int32).reshape(2, L) * 7) % V
    s = np.asarray(run.score_fn(x, jnp.array([0.5, 2.0])))
    assert s.shape == (2, L, V + 1)
    # The figures of the code that wrote the fixture (b8828335688c36e344a37aee3f2a598fca289b4c, conftest's XLA_FLAGS).
    np.testing.assert_allclose(s[0, 0, 1:4], [-4.009266376495361, -4.010530948638916, -4.010530948638916], rtol=1e-5)
    np.testing.assert_allclose(
        s[1, -1, -4:], [-6.296939373016357, -6.296939373016357, -6.296939373016357, -6.297237873077393], rtol=1e-5
    )
    np.testing.assert_allclose(s[1, 5, :3], [-6.296960830688477, -6.2969512939453125, -6.2975239753723145], rtol=1e-5)
    np.testing.assert_allclose(s.astype(np.float64).sum(), -14018.152791976929, rtol=1e-6)
    texts = run.generate(jax.random.key(0), 2, steps=4)
    chars = set(json.loads((workdir / runs.TOKENIZER).read_text())["chars"])
    assert len(texts) == 2
    for text in texts:  # L tokens of the vocabulary, each one character but the separator
        assert len(text.replace(EOS_TEXT, "\0")) == L and set(text.replace(EOS_TEXT, "")) <= chars, text


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_a_train_state_saved_with_the_layers_named_blocks_renames_whole(optimizer):
    """Checkpoints saved before 2026-12-06 name the network's layers "blocks" (the original's name) in the
    parameters, the EMA and every optimizer moment: ``files.renamed`` (what ``checkpoints.restore`` reads them through)
    renames each such key and keeps every leaf, both ways; and an old config's model.n_blocks and remat
    "blocks" read as today's model.n_layers and "layers"."""
    import ml_collections

    from sedd import files, train

    config = ml_collections.ConfigDict(
        config_lib.load_config("tiny", [f"--config.optim.optimizer={optimizer}", "--config.model.n_layers=1"]).to_dict()
    )
    config.vocab_size = 11
    state = train.Trainer(config).abstract_state
    old = files.renamed(state, "layers", files.OLD_LAYERS)
    keys = lambda tree: [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]  # noqa
    assert any("['blocks']" in k for k in keys(old)) and not any("['layers']" in k for k in keys(old))
    assert sum("['blocks']" in k for k in keys(old)) == sum("['layers']" in k for k in keys(state)) > 8
    back = files.renamed(old, files.OLD_LAYERS, "layers")
    assert jax.tree.structure(back) == jax.tree.structure(state) and keys(back) == keys(state)
    migrated = config_lib.migrate({"model": {"n_blocks": 3, "remat": "blocks"}})
    assert migrated.model.n_layers == 3 and migrated.model.remat == "layers"
    with pytest.raises(KeyError, match="config key 'model.n_blocks' is now 'model.n_layers'"):
        config_lib.load_config("tiny", ["--config.model.n_blocks=2"])
