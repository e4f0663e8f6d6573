"""Training: state, the jitted step, and one linear `train(config, workdir)`.

The run directory holds everything needed to resume or sample:
  config.json      the resolved config of the run
  tokenizer.json   the tokenizer (the char vocabulary is built from the data)
  metrics.jsonl    one JSON object per logged step (units in the key names)
  checkpoints/     orbax checkpoints of the train state

The train state is a plain pytree (dict): step, params, opt_state, ema (the
EMA of params, used for evaluation and sampling as in SEDD), key (raw key
data) and bad_step (the first step whose loss or gradient was not finite, -1
while none). A non-finite step leaves the state untouched, so a NaN can never
reach a checkpoint; the loop stops with a message naming the step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from sedd import config as config_lib
from sedd import data as data_lib
from sedd import graphs, losses, noise as noise_lib
from sedd import sharding as sharding_lib
from sedd.model import DDiT, param_count

# --------------------------------------------------------------------------- builders


def build_graph(config) -> Any:
    """The forward graph of ``config.graph.type`` over config.vocab_size tokens (sedd.graphs)."""
    return graphs.get_graph(config.graph.type, config.vocab_size)


def build_noise(config) -> Any:
    """The noise schedule of ``config.noise`` (sedd.noise.LogLinear or Geometric)."""
    n = config.noise
    if n.type == "loglinear":
        return noise_lib.LogLinear(n.eps)
    if n.type == "geometric":
        return noise_lib.Geometric(n.sigma_min, n.sigma_max)
    raise ValueError(f"unknown noise.type {n.type!r}; expected one of {sorted(noise_lib.NOISES)}")


def build_model(config, seed: int = 0) -> DDiT:
    """The network of `config.model` for a vocabulary of config.vocab_size tokens."""
    m = config.model
    if m.kind not in ("ddit", "ar"):
        raise ValueError(f"unknown model.kind {m.kind!r}; expected 'ddit' or 'ar'")
    ar = m.kind == "ar"
    return DDiT(
        vocab_size=config.vocab_size,
        hidden_size=m.hidden_size,
        n_blocks=m.n_blocks,
        n_heads=m.n_heads,
        cond_dim=m.cond_dim,
        mlp_ratio=m.mlp_ratio,
        dropout=m.dropout,
        max_len=config.data.seq_len,
        # The AR baseline takes the extra id V as its beginning-of-sequence token (sedd.ar).
        absorbing=config.graph.type == "absorbing" or ar,
        scale_by_sigma=m.scale_by_sigma and not ar,
        causal=ar,
        time_conditioning=not ar,
        dtype=jnp.dtype(m.dtype),
        rngs=nnx.Rngs(params=seed, dropout=seed + 1),
    )


def learning_rate_schedule(optim, n_updates: int) -> optax.Schedule:
    """Linear warmup from 0, then constant or cosine decay to 10% of the peak."""
    if optim.schedule == "constant":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, optim.lr, max(optim.warmup, 1)), optax.constant_schedule(optim.lr)],
            [max(optim.warmup, 1)],
        )
    if optim.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, optim.lr, max(optim.warmup, 1), max(n_updates, optim.warmup + 1), end_value=0.1 * optim.lr
        )
    raise ValueError(f"unknown optim.schedule {optim.schedule!r}; expected 'constant' or 'cosine'")


def build_optimizer(config) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW with global-norm clipping, warmup, and optional gradient accumulation."""
    o, t = config.optim, config.training
    if t.accum_steps < 1:
        raise ValueError(f"training.accum_steps must be >= 1, got {t.accum_steps}")
    schedule = learning_rate_schedule(o, t.n_iters // t.accum_steps)
    parts = [optax.clip_by_global_norm(o.grad_clip)] if o.grad_clip > 0 else []
    parts.append(optax.adamw(schedule, b1=o.beta1, b2=o.beta2, eps=o.eps, weight_decay=o.weight_decay))
    tx = optax.chain(*parts)
    if t.accum_steps > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=t.accum_steps)
    return tx, schedule


# --------------------------------------------------------------------------- state and steps


class Trainer:
    """The pure functions of a run: init, train_step, eval_step, score_fn.

    Holds the static parts (model graph, graph, noise, optimizer) so that the
    jitted functions close over them and take only arrays.

    Every jitted function carries the NamedShardings of the mesh (default: the
    mesh of config.mesh over all devices; see sedd/sharding.py): one code path
    for 1 device (a 1 x 1 x 1 mesh) and for a pod.
    """

    def __init__(self, config, mesh: jax.sharding.Mesh | None = None):
        self.config = config
        self.graph = build_graph(config)
        self.noise = build_noise(config)
        self.tx, self.schedule = build_optimizer(config)
        self.mesh = mesh if mesh is not None else sharding_lib.make_mesh(config.mesh)
        self.rules = sharding_lib.make_rules(config.mesh.rules)
        # Only the graph and the (tiny) dropout key state are kept from this
        # build; init_state builds the parameters again inside jit, directly
        # in their shards.
        model = build_model(config, config.seed)
        self.n_params = param_count(model)
        self.graphdef, _, self.rest = nnx.split(model, nnx.Param, ...)
        del model
        self.accum = config.training.accum_steps
        abstract = jax.eval_shape(self._init_state)
        self.state_sharding = sharding_lib.state_shardings(abstract, self.mesh, self.rules)
        self.param_sharding = self.state_sharding["params"]
        self.batch_sharding = sharding_lib.batch_sharding(self.mesh, self.rules)
        replicated = sharding_lib.replicated(self.mesh)
        self._init_jit = jax.jit(self._init_state, out_shardings=self.state_sharding)
        self._abstract_state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, self.state_sharding
        )
        # One function object for the sampler's compile cache: weights go in
        # as traced score_params, so new weights never recompile.
        self.params_score_fn = lambda params, x, sigma: self.model(params)(x, sigma, deterministic=True)
        self.train_step = jax.jit(
            self._train_step,
            in_shardings=(self.state_sharding, self.batch_sharding),
            out_shardings=(self.state_sharding, replicated),
            donate_argnums=0,
        )
        self._eval_jit = jax.jit(self._eval_step, out_shardings=replicated)

    def eval_step(self, params, batch, key: jax.Array) -> jax.Array:
        """Per-sequence DSE loss (nats), float32[B], of a batch every process holds in full."""
        return self._eval_jit(params, sharding_lib.place_global(batch, self.mesh, self.rules), key)

    def shard_batch(self, local_batch) -> jax.Array:
        """This process's rows of a training batch -> the global batch, split over the data axes."""
        return sharding_lib.shard_batch(local_batch, self.mesh, self.rules)

    def init_state(self) -> dict:
        """A fresh train state, each array created directly in its shards."""
        return self._init_jit()

    def abstract_state(self) -> dict:
        """The train state as jax.ShapeDtypeStructs carrying their NamedShardings (restore targets)."""
        return self._abstract_state

    def _init_state(self) -> dict:
        params = nnx.state(build_model(self.config, self.config.seed), nnx.Param)
        return {
            "step": jnp.zeros((), jnp.int32),
            "params": params,
            "opt_state": self.tx.init(params),
            "ema": jax.tree.map(jnp.copy, params),
            "key": jax.random.key_data(jax.random.key(self.config.seed)),
            "bad_step": jnp.full((), -1, jnp.int32),
        }

    def model(self, params) -> DDiT:
        return nnx.merge(self.graphdef, params, self.rest)

    def score_fn(self, params, dropout_key=None) -> Callable:
        """(x, sigma) -> log-score of the network with these parameters."""
        model = self.model(params)
        if dropout_key is None:
            return lambda x, sigma: model(x, sigma, deterministic=True)
        return lambda x, sigma: model(x, sigma, deterministic=False, rngs=dropout_key)

    def _loss(self, params, key, batch, train: bool):
        k_loss, k_drop = jax.random.split(key)
        t = self.config.training
        if self.config.model.kind == "ar":  # next-token cross-entropy, nats per sequence
            from sedd import ar  # lazy: ar imports the model module only

            model = self.model(params)
            per_seq = ar.sequence_nll(model, batch, deterministic=not train, rngs=k_drop if train else None)
            return per_seq.mean(), per_seq
        per_seq = losses.loss_fn(
            k_loss,
            self.score_fn(params, k_drop if train else None),
            self.graph,
            self.noise,
            batch,
            sampling_eps=t.sampling_eps,
            low_discrepancy=t.low_discrepancy,
        )  # (B,) nats per sequence
        return per_seq.mean(), per_seq

    def _train_step(self, state: dict, batch: jax.Array) -> tuple[dict, dict]:
        step = state["step"]
        key = jax.random.fold_in(jax.random.wrap_key_data(state["key"]), step)
        (loss, _), grads = jax.value_and_grad(self._loss, has_aux=True)(state["params"], key, batch, True)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)

        # EMA as SEDD: decay min(ema, (1 + n) / (10 + n)) after the n-th update;
        # with gradient accumulation only the calls that update count.
        n_updates = (step + 1) // self.accum
        applied = (step + 1) % self.accum == 0
        decay = jnp.minimum(self.config.training.ema, (1.0 + n_updates) / (10.0 + n_updates))
        decay = jnp.where(applied, decay, 1.0)
        ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, state["ema"], params)

        # A non-finite loss or gradient leaves the state as it was.
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
        new_state = {
            "step": step + 1,
            "params": keep(params, state["params"]),
            "opt_state": keep(opt_state, state["opt_state"]),
            "ema": keep(ema, state["ema"]),
            "key": state["key"],
            "bad_step": jnp.where((state["bad_step"] < 0) & ~finite, step, state["bad_step"]),
        }
        metrics = {
            "loss_nats_per_token": loss / batch.shape[1],
            "grad_norm": grad_norm,
            "lr": self.schedule(n_updates),
        }
        return new_state, metrics

    def _eval_step(self, params, batch: jax.Array, key: jax.Array) -> jax.Array:
        """Per-sequence DSE loss (nats) of `params` on a batch, dropout off: float32[B]."""
        return self._loss(params, key, batch, False)[1]


# --------------------------------------------------------------------------- run directory


def _check_compatible(workdir: Path, config) -> None:
    """A run directory with checkpoints must be resumed with a config of the same shapes."""
    saved_path = workdir / "config.json"
    if not saved_path.exists():
        return
    saved = json.loads(saved_path.read_text())
    for section in ("model", "graph"):
        if saved.get(section) != config[section].to_dict():
            raise ValueError(
                f"{workdir} holds a run with a different {section} config:\n  saved:   "
                f"{saved.get(section)}\n  current: {config[section].to_dict()}\n"
                "Use a new --workdir, or the saved config (the run directory was left as it is)."
            )
    for key in ("name", "path", "tokenizer", "seq_len"):
        if saved.get("data", {}).get(key) != config.data[key]:
            raise ValueError(
                f"{workdir} holds a run with data.{key}={saved['data'].get(key)!r}, "
                f"not {config.data[key]!r}; use a new --workdir (the run directory was left as it is)"
            )


def checkpoint_manager(workdir: Path, config=None, read_only: bool = False) -> ocp.CheckpointManager:
    """The orbax manager of workdir/checkpoints, keeping what config.training asks for."""
    t = config.training if config is not None else None
    absl = logging.getLogger("absl")
    level = absl.level
    if read_only:  # orbax warns that a read-only manager is read-only: noise for `sedd sample`
        absl.setLevel(logging.ERROR)
    try:
        options = ocp.CheckpointManagerOptions(
            max_to_keep=t.max_to_keep if t else None,
            keep_period=(t.keep_period or None) if t else None,
            create=not read_only,
            read_only=read_only,
        )
        return ocp.CheckpointManager(Path(workdir).absolute() / "checkpoints", options=options)
    finally:
        absl.setLevel(level)


def restore_state(manager: ocp.CheckpointManager, target: dict, step: int | None = None) -> dict:
    """Restore a train state onto the shapes, dtypes and shardings of `target`.

    `target` is a train state or `Trainer.abstract_state()`; its leaves must
    carry concrete NamedShardings. The checkpoint may come from another mesh:
    orbax reads each device's shard of the new layout.

    Raises:
      RuntimeError: naming the checkpoint, when it is corrupt or does not fit.
    """
    step = manager.latest_step() if step is None else step
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target)
    try:
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    except Exception as e:  # orbax raises many types for unreadable or mismatched files
        raise RuntimeError(
            f"could not restore the checkpoint of step {step} in {manager.directory}: "
            f"{type(e).__name__}: {str(e)[:500]}\nIt is corrupt or was written by an "
            "incompatible config. The run directory was left as it is; move it away or "
            "pass a new --workdir."
        ) from e
    return restored["state"]


def load_run(workdir: str | Path, use_ema: bool = True):
    """A trained run for sampling or evaluation: (config, tokenizer, trainer, params).

    Raises:
      FileNotFoundError: the directory holds no trained run.
    """
    workdir = Path(workdir)
    if not (workdir / "config.json").exists():
        raise FileNotFoundError(f"{workdir} is not a run directory (no config.json); train one with `sedd train`")
    config = config_lib.from_json((workdir / "config.json").read_text())
    tokenizer = data_lib.load_tokenizer(workdir / "tokenizer.json")
    try:
        mesh = sharding_lib.make_mesh(config.mesh)
    except ValueError:  # trained on a mesh these devices cannot form: data parallel over all of them
        mesh = sharding_lib.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
    trainer = Trainer(config, mesh)
    manager = checkpoint_manager(workdir, read_only=True)
    if manager.latest_step() is None:
        raise FileNotFoundError(f"{workdir} holds no checkpoint yet; train first with `sedd train`")
    state = restore_state(manager, trainer.abstract_state())
    return config, tokenizer, trainer, state["ema" if use_ema else "params"]


class MetricsWriter:
    """metrics.jsonl in the run directory (one JSON object per logged step), and
    TensorBoard event files in <workdir>/tensorboard where tensorboardX is installed.
    Inactive on processes other than 0."""

    def __init__(self, workdir: Path, active: bool = True):
        self.file = open(workdir / "metrics.jsonl", "a") if active else None
        self.tb = None
        if active:
            try:
                from tensorboardX import SummaryWriter  # optional: pip install tensorboardX

                self.tb = SummaryWriter(str(workdir / "tensorboard"))
            except ImportError:  # no writer installed: metrics.jsonl only
                pass

    def write(self, row: dict) -> None:
        if self.file is None:
            return
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in row.items():
                if k != "step":
                    self.tb.add_scalar(k, v, row["step"])

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


class _Stop:
    """Turns SIGTERM / Ctrl-C into a flag the loop checks after each step."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no signal handling
                pass
        return self

    def _handle(self, signum, frame):
        if self.requested:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


# --------------------------------------------------------------------------- evaluation helpers


def evaluate(trainer: Trainer, params, dataset, n_batches: int, batch_size: int, seed: int = 0) -> float:
    """Mean DSE loss in nats per token over the first n_batches validation batches.

    One Monte Carlo draw of (t, x_t) per sequence with a fixed key, so the
    figure is comparable across evaluations; `sedd.evaluate` gives the tighter
    likelihood bound.
    """
    total, count = 0.0, 0
    key = jax.random.key(seed + 12345)
    for i, batch in enumerate(dataset.eval_batches(batch_size)):
        if i >= n_batches:
            break
        per_seq = trainer.eval_step(params, jnp.asarray(batch), jax.random.fold_in(key, i))
        total += float(per_seq.sum())
        count += batch.size
    return total / max(count, 1)


def generate(trainer: Trainer, params, key, num_samples: int, steps: int | None = None, **kwargs) -> np.ndarray:
    """Samples of the model: int32[num_samples, L] token ids.

    Keyword arguments go to ``sampling.sample`` (conditioning, predictor, ...);
    with return_trajectory=True the result is (samples, trajectory).
    """
    from sedd import sampling  # sampling depends on nothing here; kept lazy for start-up time

    c = trainer.config
    if c.model.kind == "ar":  # the AR baseline decodes with its KV cache
        from sedd import ar

        return np.asarray(ar.sample(key, trainer.model(params), num_samples, c.data.seq_len,
                                    categorical=kwargs.pop("categorical", c.sampling.categorical)))
    out = sampling.sample(
            key,
            trainer.params_score_fn,
            trainer.graph,
            trainer.noise,
            (num_samples, c.data.seq_len),
            steps or c.sampling.steps,
            predictor=kwargs.pop("predictor", c.sampling.predictor),
            eps=c.sampling.eps,
            categorical=kwargs.pop("categorical", c.sampling.categorical),
            score_params=params,
            **kwargs,
        )
    return jax.tree.map(np.asarray, out)


def decode(tokenizer, ids) -> str:
    """One sequence of token ids (int[L]) as text."""
    return tokenizer.decode([int(i) for i in ids])


# --------------------------------------------------------------------------- the loop


def train(config: ml_collections.ConfigDict, workdir: str | Path, quiet: bool = False) -> dict:
    """Train (or resume) the run in `workdir`; returns the final figures.

    Returns:
      dict with step, val_nats_per_token, val_bits_per_token, val_bits_per_char
      (when the data has a characters-per-token ratio), unigram_entropy_bits,
      and samples (decoded strings).
    """
    workdir = Path(workdir)
    t = config.training

    # ---- processes and mesh: a multi-host job connects before any device is
    # touched; a mesh that does not fit the devices fails here, before data is read
    sharding_lib.initialize_distributed(config)
    mesh = sharding_lib.make_mesh(config.mesh)
    lead = jax.process_index() == 0  # only process 0 logs and writes run files
    quiet = quiet or not lead
    say = (lambda *a: None) if quiet else (lambda *a: tqdm.write(" ".join(str(x) for x in a)))

    # ---- data and tokenizer (the tokenizer is saved with the run)
    _check_compatible(workdir, config)
    tok_path = workdir / "tokenizer.json"
    tokenizer = data_lib.load_tokenizer(tok_path) if tok_path.exists() else None
    dataset = data_lib.load_dataset(config.data, tokenizer=tokenizer)
    tokenizer = dataset.tokenizer
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = tokenizer.vocab_size
    workdir.mkdir(parents=True, exist_ok=True)
    if jax.process_count() > 1:  # every process has read the run directory before process 0 writes it
        multihost_utils.sync_global_devices("sedd: run directory read")
    if lead:
        if not tok_path.exists():
            data_lib.save_tokenizer(tokenizer, tok_path)
        (workdir / "config.json").write_text(config_lib.to_json(config))
    if t.batch_size % jax.process_count():
        raise ValueError(f"training.batch_size={t.batch_size} must divide by the {jax.process_count()} processes")
    shards = sharding_lib.batch_divisor(mesh, config.mesh.rules)
    if t.batch_size % shards:
        raise ValueError(
            f"training.batch_size={t.batch_size} must divide by the {shards} batch shards of the mesh "
            f"{dict(mesh.shape)}; change the batch size or config.mesh"
        )

    # ---- model, optimizer, state; resume from the newest checkpoint if any
    trainer = Trainer(config, mesh)
    manager = checkpoint_manager(workdir, config)
    start = manager.latest_step()
    if start is not None:  # onto this run's mesh, whatever mesh wrote it
        state = restore_state(manager, trainer.abstract_state(), start)
        say(f"resumed {workdir} at step {start}")
    else:
        state = trainer.init_state()
    start = int(state["step"])
    entropy = dataset.unigram_entropy_bits()
    cpt = dataset.chars_per_token
    say(
        f"model: {trainer.n_params / 1e6:.2f}M parameters; data: {dataset.num_tokens('train'):,} train tokens, "
        f"vocabulary {tokenizer.vocab_size}, unigram entropy {entropy:.3f} bits/token"
    )

    def val_figures(params) -> dict:
        nats = evaluate(trainer, params, dataset, t.eval_batches, t.batch_size, config.seed)
        u = losses.units(nats, chars_per_token=cpt)
        return {f"val_{k}": v for k, v in u.items()}

    # ---- the loop
    batches = dataset.train_batches(
        t.batch_size, seed=config.seed, start_step=start,
        process_index=jax.process_index(), process_count=jax.process_count(),
    )
    writer = MetricsWriter(workdir, active=jax.process_index() == 0)
    val = {}
    tokens_per_step = t.batch_size * config.data.seq_len
    last_time, last_step = time.perf_counter(), start
    step = start
    stopped = False
    with _Stop() as stop, tqdm(total=t.n_iters, initial=start, disable=quiet, desc="train", dynamic_ncols=True) as bar:
        while step < t.n_iters:
            state, metrics = trainer.train_step(state, trainer.shard_batch(next(batches)))
            step += 1
            bar.update(1)
            boundary = step % t.log_every == 0 or step % t.ckpt_every == 0 or step == t.n_iters or stop.requested
            if boundary:
                bad = int(state["bad_step"])
                if bad >= 0:
                    writer.close()
                    raise FloatingPointError(
                        f"non-finite loss or gradient at step {bad}; nothing after step {bad} was applied "
                        f"or saved. The last checkpoint is step {manager.latest_step()} in {workdir}. "
                        "Try a lower optim.lr or optim.grad_clip, or float32 compute (model.dtype)."
                    )
            if step % t.log_every == 0 or step == t.n_iters:
                now = time.perf_counter()
                row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
                row["loss_bits_per_token"] = row["loss_nats_per_token"] / math.log(2)
                if cpt:
                    row["loss_bits_per_char"] = row["loss_bits_per_token"] / cpt
                row["tokens_per_s"] = (step - last_step) * tokens_per_step / max(now - last_time, 1e-9)
                last_time, last_step = now, step
                if step % t.eval_every == 0 or step == t.n_iters:
                    val = val_figures(state["ema"])
                    row.update(val)
                bar.set_postfix(loss=f"{row['loss_bits_per_token']:.3f} bits/tok")
                writer.write(row)
            if step % t.eval_every == 0 and step < t.n_iters and t.eval_samples:
                ids = generate(trainer, state["ema"], jax.random.key(step), t.eval_samples)
                for s in ids:
                    say(f"[step {step}] {decode(tokenizer, s)!r}")
            if step % t.ckpt_every == 0 or step == t.n_iters or stop.requested:
                if manager.latest_step() != step:
                    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
            if stop.requested:
                stopped = True
                break
    manager.wait_until_finished()
    writer.close()
    if stopped:
        say(f"stopped at step {step}; checkpoint saved in {workdir}. Run the same command to resume.")
        return {"step": step, "stopped": True}

    # ---- final figures
    if step != t.n_iters or not val:  # the loop evaluates at n_iters, unless the run had already ended
        val = val_figures(state["ema"])
    result = {"step": step, "stopped": False, "unigram_entropy_bits": entropy, **val}
    if cpt:
        result["unigram_entropy_bits_per_char"] = entropy / cpt
    result["samples"] = [
        decode(tokenizer, s) for s in generate(trainer, state["ema"], jax.random.key(config.seed), max(t.eval_samples, 1))
    ]
    return result
