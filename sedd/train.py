r"""Training: the train state, the jitted step, and one linear ``train(config, workdir)``.

The train state is a plain pytree (dict): step, params, opt_state, ema (the
EMA of params, used for evaluation and sampling as in SEDD), key (raw key
data) and bad_step (the first step, counted from 1 as logged, whose loss or gradient was not finite, -1
while none). A non-finite step leaves the state untouched, so a NaN can never
reach a checkpoint; the loop stops with a message naming the step.

The run directory it writes (config, tokenizer, metrics, checkpoints) is
described in ``sedd.runs``, which also loads the trained model for inference.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from sedd import checkpoints, files, kernels, kinds, lock, losses, optim, runs, validate
from sedd.progress import BarLines, MetricsWriter, Pace
from sedd import config as config_lib
from sedd import sharding as sharding_lib
from sedd.data import load_dataset, load_tokenizer, save_tokenizer
from sedd.data.tokenizers import EOS_TEXT

MAX_STEPS_IN_FLIGHT = 2
"""Steps the loop dispatches ahead of the devices at most. Enough to keep an accelerator fed; and unbounded
(a quiet run syncs only to log), XLA's CPU runtime with several devices aborted: a step's all-reduce waited
for a device thread that never came while later steps queued (8 devices on 2 cores, "Termination timeout
for all reduce", tests/test_evaluate.py's trained bound)."""

UNREADABLE = "checkpoints_unreadable"  # where a resumed run moves checkpoints it cannot read (kept, never deleted)
BOUND_NUM_T = 64  # t-grid points of the bound reported at the end of a run, as `sedd eval` takes by default

# =========================================================================== state and step


class Trainer:
    """The pure functions of a run: init_state, train_step, loss_step.

    Holds the static parts (network structure, graph, noise, optimizer, mesh)
    so that the jitted functions close over them and take only arrays. Every
    jitted function carries the NamedShardings of the mesh (default: the mesh
    of config.mesh over all devices; see sedd/sharding.py): one code path for
    1 device (a 1 x 1 x 1 mesh) and for a pod. With ``zero1`` the optimizer
    state is split along "data" (ZeRO-1, `sharding.optimizer_shardings`);
    None (the default) does so for Muon, whose Newton-Schulz products it
    splits over the devices, and not for AdamW, whose elementwise update it
    only makes wait for one more all-gather (bench.py optimizer, docs/scaling.md).
    """

    def __init__(self, config, mesh: jax.sharding.Mesh | None = None, zero1: bool | None = None):
        self.config = config
        self.kind = kinds.get(config)
        self.kind.check_sampler(config.sampling.sampler)  # before training, not at its first evaluation
        self.tx, self.schedule = optim.build_optimizer(config)
        self.mesh = mesh if mesh is not None else sharding_lib.make_mesh(config.mesh)
        rules = sharding_lib.make_rules(config.mesh.rules)
        self.graphdef, abstract_params, self.rest = kinds.abstract_network(self.kind, config.seed)
        self.n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(abstract_params))
        self.accum = config.training.accum_steps
        abstract = jax.eval_shape(self._init_state)
        self.state_sharding = sharding_lib.param_shardings(abstract, self.mesh, rules)
        if zero1 or (zero1 is None and config.optim.optimizer == "muon"):
            self.state_sharding["opt_state"] = sharding_lib.optimizer_shardings(
                abstract["opt_state"], self.state_sharding["opt_state"], self.mesh
            )
        self.batch_sharding = sharding_lib.batch_sharding(self.mesh, rules)
        self.batch_divisor = sharding_lib.batch_divisor(self.mesh, rules)
        self._rules = rules
        replicated = sharding_lib.replicated(self.mesh)
        self._init_jit = jax.jit(self._init_state, out_shardings=self.state_sharding)
        self.abstract_state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, self.state_sharding
        )
        self.train_step = jax.jit(
            self._train_step,
            in_shardings=(self.state_sharding, self.batch_sharding),
            out_shardings=(self.state_sharding, replicated),
            donate_argnums=0,
        )
        self._loss_jit = jax.jit(lambda p, x, k: self._loss(p, k, x, train=False)[1], out_shardings=replicated)

    def init_state(self) -> dict:
        """A fresh train state, each array created directly in its shards."""
        return self._init_jit()

    def shard_batch(self, local_batch) -> jax.Array:
        """This process's rows of a training batch -> the global batch, split over the data axes."""
        return sharding_lib.shard_batch(local_batch, self.mesh, self._rules)

    def loss_step(self, params, batch, key: jax.Array) -> jax.Array:
        """Per-sequence loss (nats), float32[B], dropout off, of a batch every process holds in full."""
        return self._loss_jit(params, sharding_lib.place_global(batch, self.mesh, self._rules), key)

    def _init_state(self) -> dict:
        return self.state_of(nnx.state(self.kind.network(self.config.seed), nnx.Param))

    def state_of(self, params) -> dict:
        """The train state at step 0 around these parameters (the EMA a copy of them, a fresh optimizer)."""
        return {
            "step": jnp.zeros((), jnp.int32),
            "params": params,
            "opt_state": self.tx.init(params),
            "ema": jax.tree.map(jnp.copy, params),
            "key": jax.random.key_data(jax.random.key(self.config.seed)),
            "bad_step": jnp.full((), -1, jnp.int32),
        }

    def _loss(self, params, key, batch, train: bool):
        """The kind's training objective of a batch x0 [B, L], nats per sequence: (mean, per-sequence [B]).

        Dropout (train) draws from its own key; the loss's draws (t, x_t) from the other.
        """
        k_loss, k_drop = jax.random.split(key)
        model = nnx.merge(self.graphdef, params, self.rest)
        with sharding_lib.split_rows(self.batch_sharding):  # activations split by rows, weights gathered
            per_seq = self.kind.loss(k_loss, model, batch, train, rngs=k_drop if train else None)
        return per_seq.mean(), per_seq  # (), (B,)

    def objective(self, params, key: jax.Array, batch: jax.Array, state: dict):
        """What a training step minimises over `params`: (mean, per-sequence [B]) nats; the kind's loss here.

        `state` is the train state the step starts from (a subclass's objective
        may read more of it: ``sedd.distill``'s teacher).
        """
        return self._loss(params, key, batch, True)

    def _train_step(self, state: dict, batch: jax.Array) -> tuple[dict, dict]:
        r"""One AdamW update on the mean loss, then the EMA, unless the step is not finite.

            g = \nabla_\theta mean_B L(x0),   \theta <- AdamW(\theta, clip(g)),
            \bar\theta <- d \bar\theta + (1 - d) \theta,   d = min(ema, (1 + n) / (10 + n)),

        n the number of updates so far (SEDD's EMA warm-up); key = fold_in(key, step).
        """
        step = state["step"]
        key = jax.random.fold_in(jax.random.wrap_key_data(state["key"]), step)
        (loss, _), grads = jax.value_and_grad(self.objective, has_aux=True)(state["params"], key, batch, state)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)

        # With gradient accumulation only the calls that update count.
        n_updates = (step + 1) // self.accum
        applied = (step + 1) % self.accum == 0
        decay = jnp.minimum(self.config.training.ema, (1.0 + n_updates) / (10.0 + n_updates))
        decay = jnp.where(applied, decay, 1.0)
        ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, state["ema"], params)

        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        new_state = {
            **state,  # what a subclass keeps beside these (sedd.distill's teacher)
            "step": step + 1,
            "params": keep(params, state["params"]),
            "opt_state": keep(opt_state, state["opt_state"]),
            "ema": keep(ema, state["ema"]),
            "key": state["key"],
            "bad_step": jnp.where((state["bad_step"] < 0) & ~finite, step + 1, state["bad_step"]),  # 1-based, as logged
        }
        metrics = {"loss_nats_per_token": loss / batch.shape[1], "grad_norm": grad_norm, "lr": self.schedule(n_updates)}
        return new_state, metrics


def estimate_loss(trainer: Trainer, params, dataset, n_batches: int, batch_size: int, seed: int = 0) -> float:
    """A quick estimate of the validation loss, nats per token: one draw of t per sequence.

    The same fixed key at every evaluation, so the estimates of a run are
    comparable with each other; ``sedd.evaluate.likelihood_bound`` gives the
    bound itself, with a standard error.
    """
    total, count = 0.0, 0
    key = jax.random.key(seed + 12345)
    for i, batch in zip(range(n_batches), dataset.eval_batches(batch_size)):
        total += float(trainer.loss_step(params, jnp.asarray(batch), jax.random.fold_in(key, i)).sum())
        count += batch.size
    return total / max(count, 1)


# =========================================================================== the loop's helpers


class StopRequest:
    """SIGTERM / Ctrl-C as a request to save and stop, agreed by all processes.

    A signal reaches one process (a preempted host, a Ctrl-C in one terminal);
    ``agreed()`` all-gathers the flags, so every process sees the request at
    the same step, saves that step and leaves together. In a single process it
    is the local flag; with several it costs one tiny all-gather per step.

    The request is answered at once: Python's C-level handler writes the
    signal's number to a wakeup socket even while the main thread is inside a
    compiled call, and a small thread prints what will happen. A second Ctrl-C
    is answered the same way and otherwise ignored, so it can never interrupt
    the save; Ctrl-\\ (SIGQUIT) or SIGKILL end the process at once, keeping the
    newest whole checkpoint.
    """

    NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}

    def __init__(self, say=None):
        self.requested = False
        self.count = 0
        self._say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._old = {}
        self._old_wakeup = None
        self._sockets = None

    def __enter__(self):
        try:
            for sig in self.NAMES:
                self._old[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: no signal handling
            return self
        read, write = socket.socketpair()
        write.setblocking(False)
        self._old_wakeup = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        self._sockets = (read, write)
        threading.Thread(target=self._answer, args=(read,), daemon=True, name="sedd-stop").start()
        return self

    def _handle(self, signum, frame):  # runs in the main thread, between bytecodes
        self.requested = True
        if self._sockets is None:
            self._answer_one(signum)

    def _answer(self, read):  # the wakeup socket's reader: answers while the main thread is busy
        while data := read.recv(64):
            for signum in data:
                if signum in self.NAMES:
                    self._answer_one(signum)

    def _answer_one(self, signum):
        self.count += 1
        if self.count == 1:
            self._say(
                f"\n{self.NAMES[signum]}: saving a checkpoint at the end of this step, then stopping "
                "(Ctrl-C again does not interrupt the save; Ctrl-\\ quits now, losing the steps since the "
                "last checkpoint)"
            )
        else:
            self._say(f"\n{self.NAMES[signum]} again: still saving, then stopping; the save is not interrupted")

    def agreed(self) -> bool:
        if jax.process_count() == 1:
            return self.requested
        return bool(multihost_utils.process_allgather(np.int32(self.requested)).max())

    def __exit__(self, *exc):
        if self._sockets is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            for sock in self._sockets:
                sock.close()
        for sig, old in self._old.items():
            signal.signal(sig, old)


def dtype_line(name: str) -> str:
    """The dtype the model computes in on this machine for model.dtype = `name`, and why: one line."""
    dtype = kernels.compute_dtype(name).name
    forced = os.environ.get(kernels.DTYPE_ENV)
    if forced:
        return f"compute dtype {dtype} ({kernels.DTYPE_ENV}={forced} overrides model.dtype={name!r})"
    if name != "auto":
        return f"compute dtype {dtype} (model.dtype={name!r})"
    backend = jax.default_backend()
    if backend != "cpu":
        why = f"a {backend.upper()} multiplies bfloat16 in hardware"
    elif kernels.cpu_has_bfloat16_dots():
        why = "this CPU has AVX512-BF16 or AMX-BF16"
    else:
        why = "no AVX512-BF16 or AMX-BF16 on this CPU, so bfloat16 would run in software"
    return f"compute dtype {dtype} (model.dtype='auto': {why}; --config.model.dtype=float32|bfloat16 sets it)"


def _save_failed(e: Exception, manager: ocp.CheckpointManager, what: str = "") -> RuntimeError:
    """A failed checkpoint save (or `what` else failed to write) as one clear error naming what is still on
    disk, and an orbax temporary folder left (a partial copy, never read as a checkpoint) if one could not go."""
    full = isinstance(e, OSError) and e.errno == errno.ENOSPC
    do = "Run the same command to resume"
    if full or "No space left on device" in str(e):
        ours = full and not isinstance(e, files.DiskError) and e.strerror != os.strerror(errno.ENOSPC)
        detail = e.strerror if ours else ""  # our own check's figures
        reason = f"the disk is full (no space left on device{': ' + detail if detail else ''})"
        do = "Free some space, then run the same command to resume"
    elif isinstance(e, OSError) and e.errno in files.DO:  # a read-only disk, a folder not ours, ...
        reason, do = files.DO[e.errno].split(". ", 1)
    else:
        reason = validate.one_line(e, 500)
    left = ", ".join(str(p) for p in Path(manager.directory).glob("*.orbax-checkpoint-tmp*"))
    manager.reload()
    newest = manager.latest_step()
    kept = (
        f"the checkpoints on disk are intact, the newest is step {newest}"
        if newest is not None
        else "there is no earlier checkpoint"
    )
    return RuntimeError(
        f"{what or f'saving a checkpoint in {manager.directory}'} failed: {reason}. {kept[0].upper()}{kept[1:]}"
        f"{f'; remove the partial copy {left}' if left else ''}. {do}."
    )


# =========================================================================== the loop


def check_intervals(t) -> None:
    """Refuse (ValueError, one line) a training section whose steps between logs, evaluations or checkpoints are
    not an integer >= 1 (0 was a ZeroDivisionError)."""
    for key in ("log_every", "eval_every", "ckpt_every"):
        if not (isinstance(t[key], int) and not isinstance(t[key], bool) and t[key] >= 1):
            raise ValueError(
                f"training.{key}={validate.shown(t[key])} must be an integer >= 1 (steps between "
                f"{key.split('_')[0]}s; training.n_iters={t.n_iters} for once at the end)"
            )


def started_from(trainer: Trainer, workdir: str, tokenizer, say=print) -> dict:
    """The train state at step 0 around the EMA weights of the run in `workdir` (training.init_from), each array
    in this run's shards: ``Kind.params_from`` maps them (an AR run's to a token-shift block network's too).

    Raises:
      ValueError: the run's vocabulary differs from this one's, or its network does not fit this kind's.
    """
    source = runs.load(workdir)
    if source.tokenizer.to_dict() != tokenizer.to_dict():
        raise ValueError(f"training.init_from={workdir!r} reads another vocabulary than this run's data")
    params = trainer.kind.params_from(source, nnx.state(trainer.kind.network(trainer.config.seed), nnx.Param))
    say(f"started from the EMA weights of {workdir} at its step {source.step} ({source.kind.label})")
    return jax.jit(trainer.state_of, out_shardings=trainer.state_sharding)(params)


def train(
    config: ml_collections.ConfigDict,
    workdir: str | Path,
    quiet: bool = False,
    split_cpu: bool = False,
    make_trainer: Callable[..., Trainer] = Trainer,
    final: bool = True,
) -> dict:
    """Train (or resume) the run in `workdir`; returns the final figures.

    make_trainer(config, mesh) builds the ``Trainer`` (a subclass trains
    another objective in the same loop: ``sedd.distill``).

    The processes and devices are set up here, the one place, before any
    device is used: a multi-process job connects
    (``sedd.sharding.initialize_distributed``); then, with split_cpu (as
    `sedd train` asks), this host's CPU becomes ``mesh.cpu_devices`` devices
    (``sedd.sharding.split_cpu``: after the connection, as auto leaves a
    multi-process job as it is; a no-op in a process that has used a device).

    final=False returns after the last checkpoint, without the final bound and samples (a sweep, or a test's
    fixture, that reads the checkpoints).

    Returns:
      dict with step, stopped, and after a finished run: val_estimate_* (``estimate_loss``),
      unigram_entropy_bits[_per_char], and with final: bound (``sedd.runs.Run.likelihood`` on the
      validation split, what `sedd eval` prints) and samples (decoded strings).
    """
    with contextlib.ExitStack() as held:  # the run's lock (lock.writing), from its first write to this call's end
        return _train_run(config, Path(workdir), quiet, split_cpu, make_trainer, held, final)


def _train_run(
    config, workdir: Path, quiet: bool, split_cpu: bool, make_trainer, held: contextlib.ExitStack, final: bool
) -> dict:
    """``train``'s work; `held` keeps the run directory's lock once the run is first written."""
    runs.check_run_links(workdir)  # nothing written, moved or deleted through a link out of the run
    runs.check_config(config, "the config")  # every size and name, before anything is read, allocated or compiled
    optim.build_optimizer(config)  # optim.optimizer and optim.schedule too
    t = config.training
    check_intervals(t)

    # ---- processes and mesh: a multi-host job connects before any device is
    # touched; a mesh that does not fit the devices fails here, before data is read
    sharding_lib.initialize_distributed(config)
    cpu_devices = sharding_lib.split_cpu(config) if split_cpu else 0
    mesh = sharding_lib.make_mesh(config.mesh)
    lead = jax.process_index() == 0  # only process 0 logs and writes run files
    quiet = quiet or not lead
    say = BarLines(quiet)
    if cpu_devices:
        say(f"this CPU as {cpu_devices} devices, the batch split over them (mesh.cpu_devices; 1 = one device)")

    # ---- data and tokenizer (the tokenizer is saved with the run)
    runs.check_compatible(workdir, config)
    tok_path = workdir / runs.TOKENIZER
    tokenizer = load_tokenizer(tok_path) if tok_path.exists() else None
    if not lead:  # process 0 prepares the data files (once, on a shared disk) before the others read them
        multihost_utils.sync_global_devices("sedd: data prepared")
    dataset = load_dataset(config.data, tokenizer=tokenizer)
    if lead and jax.process_count() > 1:
        multihost_utils.sync_global_devices("sedd: data prepared")
    tokenizer = dataset.tokenizer
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = tokenizer.vocab_size
    validate.check_training_memory(config)  # a step's rows and the samples, before anything is built or compiled

    # ---- model and optimizer (what the network checks as it is built, before anything is written)
    trainer = make_trainer(config, mesh)
    for divisor, what in ((jax.process_count(), "processes"), (trainer.batch_divisor, "batch shards of the mesh")):
        if t.batch_size % divisor:
            raise ValueError(
                f"training.batch_size={t.batch_size} must divide by the {divisor} {what} "
                f"(mesh {dict(mesh.shape)}); change the batch size or config.mesh"
            )

    # ---- the run directory: made and locked (a second writer is refused), its config and tokenizer written
    if lead:
        held.enter_context(lock.writing(workdir, (runs.TOKENIZER, runs.CONFIG)))
    else:
        workdir.mkdir(parents=True, exist_ok=True)
    if jax.process_count() > 1:  # every process has read the run directory before process 0 writes it
        multihost_utils.sync_global_devices("sedd: run directory read")
    if lead:
        if not tok_path.exists():
            save_tokenizer(tokenizer, tok_path)
        files.write_text(workdir / runs.CONFIG, config_lib.to_json(config), workdir)

    # ---- state: resumed from the newest checkpoint if any
    manager = checkpoints.checkpoint_manager(workdir, config)
    if manager.all_steps():  # onto this run's mesh, whatever mesh wrote it; an unreadable newest one is set aside
        state, at = checkpoints.restore_newest(
            manager, trainer.abstract_state, quarantine=workdir / UNREADABLE if lead else None
        )
        if jax.process_count() > 1:  # process 0 has moved what nobody can read
            multihost_utils.sync_global_devices("sedd: checkpoints restored")
            manager.reload()
        say(f"resumed {workdir} at step {at}")
    else:
        state = trainer.init_state() if not t.init_from else started_from(trainer, t.init_from, tokenizer, say)
    step = int(state["step"])
    entropy = dataset.unigram_entropy_bits()
    cpt = dataset.chars_per_token
    per_char = ""
    if cpt:  # the figure the end of the run compares with, per character
        eos = f"; {EOS_TEXT} between documents is a token of none" if tokenizer.eos_id is not None else ""
        per_char = f" = {entropy / cpt:.3f} bits/char ({cpt:.4f} characters per token{eos})"
    chars = f" ({len(tokenizer.chars)} characters and {EOS_TEXT})" if hasattr(tokenizer, "chars") else ""
    say(
        f"model: {trainer.n_params / 1e6:.2f}M parameters; data: {dataset.num_tokens('train'):,} train tokens, "
        f"vocabulary {tokenizer.vocab_size}{chars}, unigram entropy of the train split "
        f"{entropy:.3f} bits/token{per_char}"
    )
    say(dtype_line(config.model.dtype))

    def val_figures(params) -> dict:
        nats = estimate_loss(trainer, params, dataset, t.eval_batches, t.batch_size, config.seed)
        return {f"val_estimate_{k}": v for k, v in losses.units(nats, chars_per_token=cpt).items() if k != "ppl_bound"}

    def model_run(state) -> runs.Run:
        return runs.from_parts(config, tokenizer, trainer.graphdef, state["ema"], trainer.rest, step, mesh)

    def check_finite(state) -> None:
        bad = int(state["bad_step"])
        if bad >= 0:
            raise FloatingPointError(
                f"non-finite loss or gradient at step {bad}; nothing from step {bad} on was applied "
                f"or saved. The last checkpoint is step {manager.latest_step()} in {workdir}. "
                "Try a lower optim.lr or optim.grad_clip, or float32 compute (model.dtype)."
            )

    # ---- the loop
    batches = dataset.train_batches(
        t.batch_size,
        seed=config.seed,
        start_step=step,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    writer = MetricsWriter(workdir / runs.METRICS, workdir, active=lead)
    val = {}
    tokens_per_step = t.batch_size * config.data.seq_len
    last_time, last_step = time.perf_counter(), step
    loop_start = last_time
    pace = Pace(t.n_iters, active=not quiet)
    first_step = step + 1  # compiles
    stopped = False

    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))

    def save(state) -> None:  # never a non-finite state; a failed save names what is still on disk
        check_finite(state)
        free = shutil.disk_usage(manager.directory).free
        if free < 1.25 * state_bytes + 2**16:  # refuse before orbax half-writes a checkpoint
            need = f"{free / 2**20:.1f} MiB free, a checkpoint needs about {state_bytes / 2**20:.1f} MiB"
            raise _save_failed(OSError(errno.ENOSPC, need), manager)
        try:  # with a SHA-256 of each array in the step's metadata, verified at every restore
            files.save_checkpoint(manager, step, state)
        except Exception as e:
            raise _save_failed(e, manager) from e

    with (
        StopRequest(say=(lambda msg: None) if quiet else None) as stop,
        tqdm(total=t.n_iters, initial=step, disable=quiet, desc="train", dynamic_ncols=True) as bar,
    ):
        say.bar = bar
        failed = True
        try:
            in_flight = collections.deque()  # the metrics of the steps dispatched and maybe not yet run
            while step < t.n_iters:
                state, metrics = trainer.train_step(state, trainer.shard_batch(next(batches)))
                step += 1
                in_flight.append(metrics)
                if len(in_flight) > MAX_STEPS_IN_FLIGHT:
                    jax.block_until_ready(in_flight.popleft())
                bar.update(1)
                stopped = stop.agreed()  # then save this step at once; evaluation and samples wait for the resume
                if step % t.log_every == 0 or step == t.n_iters or stopped:
                    check_finite(state)
                    now = time.perf_counter()
                    row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
                    units = losses.units(row["loss_nats_per_token"], cpt)
                    row.update({f"loss_{k}": v for k, v in units.items() if k.startswith("bits")})
                    row["tokens_per_s"] = (step - last_step) * tokens_per_step / max(now - last_time, 1e-9)
                    last_time, last_step = now, step
                    row["elapsed_s"] = now - loop_start  # this process's seconds in the loop, evaluations included
                    if (step % t.eval_every == 0 or step == t.n_iters) and not stopped:
                        val = val_figures(state["ema"])
                        row.update(val)
                    bar.set_postfix(loss=f"{row['loss_bits_per_token']:.3f} bits/tok")
                    try:
                        writer.write(row)
                    except OSError as e:  # a full disk meets the metrics file first (orbax writes in the background)
                        with contextlib.suppress(Exception):  # the disk's error is the one to report, once
                            manager.wait_until_finished()  # orbax has settled: the newest step named is whole
                        raise _save_failed(e, manager, f"writing {writer.path}") from e
                if stopped:
                    save(state)
                    break
                if step % t.eval_every == 0 and step < t.n_iters and (line := pace.left(step)):
                    say(f"[step {step}] {line}")
                if step % t.eval_every == 0 and step < t.n_iters and t.eval_samples:
                    for text in model_run(state).generate(jax.random.key(step), t.eval_samples):
                        say(f"[step {step}] {text!r}")
                saving = manager.latest_step() != step and (step == t.n_iters or manager.should_save(step))
                if saving:
                    save(state)
                if line := pace.update(step, state, busy=step == first_step or step % t.eval_every == 0 or saving):
                    say(line)
            failed = False
        finally:
            try:
                writer.close()
            except OSError as e:
                if not failed:
                    raise _save_failed(e, manager, f"writing {writer.path}") from e
            try:
                manager.wait_until_finished()
            except Exception as e:
                if not failed:  # else the error already in flight is the one to report
                    raise _save_failed(e, manager) from e
    if stopped:
        say(f"stopped at step {step}; checkpoint saved in {workdir}. Run the same command to resume.")
        return {"step": step, "stopped": True}

    # ---- final figures
    if not val:  # the run had already ended before this call
        val = val_figures(state["ema"])
    result = {"step": step, "stopped": False, "unigram_entropy_bits": entropy, **val}
    if cpt:
        result["unigram_entropy_bits_per_char"] = entropy / cpt
    if final:
        run = model_run(state)
        result["bound"] = run.likelihood(
            dataset, "validation", BOUND_NUM_T, t.batch_size, t.eval_batches, progress=not quiet
        )
        result["samples"] = run.generate(jax.random.key(config.seed), max(t.eval_samples, 1))
    return result
