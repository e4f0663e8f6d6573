r"""`sedd distill`: fewer sampling steps by self-distillation through time, in `sedd train`'s loop.

SDTT (Deschenaux & Gulcehre 2024; the math in ``sedd.sdtt``) on a trained run
of the absorbing graph: round r trains a student, initialised from round
r - 1's, whose one sampler step matches two of its teacher's (round r - 1's
student; round 1: the teacher run), so with N0 = distill.teacher_steps round
r's student samples with N0 / 2^r. The distillation is a run directory like
any other (docs/distillation.md, "The run directory"), trained by
``sedd.train.train`` with ``DistillTrainer``: its train state holds one more
entry, "teacher", which at the first step of round r > 1 becomes the EMA of
round r - 1's student, inside the compiled step.

distill.order picks the sampler distilled: "random" (the default), the
analytic sampler's positions at the schedule's rate; "dilated", the dilated
sampler's planned order (SEDD runs; N0 must divide the length), whose
students sample with it by default.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from sedd import config as config_lib
from sedd import checkpoints, files, kinds, lock, runs, sdtt, train, validate
from sedd.kinds import capabilities
from sedd import sharding as sharding_lib
from sedd.sampling import planned_rank

DEFAULT_ROUNDS = 3  # 8x fewer steps, the figure the issue (51) asks of a student
DEFAULT_DIVERGENCE = "kl_backward"  # SDTT's best; why it is ours too: sedd.sdtt's docstring
DEFAULT_TARGET = "x0"  # SDTT's target: on Markov text it moved few-step samples where the two-step law did not
ORDERS = {"random": None, "dilated": "dilated"}
"""distill.order -> the sampler its students draw with (None: the teacher's sampling.sampler): "random", the
positions the analytic sampler unmasks at the schedule's rate (``sedd.sdtt.loss_per_position``); "dilated", a
planned order (``sedd.sampling.Dilated``, ``sedd.sdtt.planned_loss_per_position``)."""
ARCHITECTURE = (
    "model.kind",
    "model.block_size",
    "model.hidden_size",
    "model.n_layers",
    "model.n_heads",
    "model.cond_dim",
    "model.mlp_ratio",
    "model.scale_by_sigma",
    "model.time_conditioning",
    "model.normalize",
    "model.vocab_multiple",
    "graph.type",
    "noise.type",
    "noise.eps",
    "noise.sigma_min",
    "noise.sigma_max",
    "data.seq_len",
    "vocab_size",
)
"""Keys a distillation keeps from its teacher: the network's shapes and what its output means."""


class DistillTrainer(train.Trainer):
    """``sedd.train.Trainer`` whose step minimises SDTT's divergence (``sedd.sdtt``) against the state's teacher.

    The state is the Trainer's with "teacher" (parameters, sharded as the
    student's); ``init_state`` reads it from the teacher run's EMA.
    """

    def __init__(self, config, mesh: jax.sharding.Mesh | None = None, zero1: bool | None = None):
        check_distillable(config)
        super().__init__(config, mesh, zero1)
        d = config.distill
        self.round_steps, self.rounds, self.teacher_steps = d.round_steps, d.rounds, d.teacher_steps
        self.rank = (
            None
            if d.order == "random"
            else jnp.asarray(planned_rank(d.order, config.data.seq_len, d.teacher_steps), jnp.int32)
        )

    def state_of(self, params) -> dict:
        return {**super().state_of(params), "teacher": jax.tree.map(jnp.copy, params)}

    def init_state(self) -> dict:
        """Step 0: student, EMA and teacher the teacher run's EMA weights, each array created in its shards."""
        d = self.config.distill
        target = {"ema": self.abstract_state["params"]}
        params = checkpoints.restore(checkpoints.checkpoint_manager(d.teacher), target, d.teacher_step)["ema"]
        return jax.jit(self.state_of, out_shardings=self.state_sharding)(params)

    def round_index(self, step: jax.Array) -> jax.Array:
        """int32[]: the 0-based round a step (counted from 0) trains, capped at the last."""
        return jnp.minimum(step // self.round_steps, self.rounds - 1)

    def objective(self, params, key, batch, state):
        r"""SDTT's loss (``sedd.sdtt.loss_per_position``) of the round: nats per sequence, (mean, [B]).

        Round r (from 0) has a teacher of N0 / 2^r steps, dt = (1 - sampling.eps) 2^r / N0.
        """
        c = self.config
        k_loss, k_drop = jax.random.split(key)
        student = nnx.merge(self.graphdef, params, self.rest)
        teacher = nnx.merge(self.graphdef, jax.lax.stop_gradient(state["teacher"]), self.rest)
        groups, student_fn = self.kind.noise_groups(student, train=True, rngs=k_drop)
        _, teacher_fn = self.kind.noise_groups(teacher)
        r = self.round_index(state["step"])
        dt = (1.0 - c.sampling.eps) * jnp.exp2(r.astype(jnp.float32)) / self.teacher_steps
        args = (k_loss, teacher_fn, student_fn, self.kind.graph, self.kind.noise, batch)
        both = dict(t_end=c.sampling.eps, divergence_name=c.distill.divergence)  # the two objectives' options
        with sharding_lib.split_rows(self.batch_sharding):
            if self.rank is None:
                per_position = sdtt.loss_per_position(
                    *args, dt, block_size=groups, t_min=c.training.sampling_eps, target=c.distill.target, **both
                )
            else:
                n = jnp.right_shift(jnp.int32(self.teacher_steps), r)  # the round's teacher steps, N0 / 2^r
                per_position = sdtt.planned_loss_per_position(*args, self.rank, n, **both)
            per_seq = per_position.sum(-1)
        return per_seq.mean(), per_seq

    def _train_step(self, state, batch):
        """The Trainer's step; at the first step of a round after the first, the teacher <- the EMA first."""
        step = state["step"]
        new_round = (step > 0) & (step % self.round_steps == 0)
        teacher = jax.lax.cond(new_round, lambda s: s["ema"], lambda s: s["teacher"], state)
        state, metrics = super()._train_step({**state, "teacher": teacher}, batch)
        metrics["round"] = self.round_index(step) + 1
        return state, metrics


def check_distillable(config) -> None:
    """Refuse, in one line, a distillation the config cannot make.

    Raises:
      ValueError: not the absorbing graph (the uniform graph moves every
        token, and DUO's consistency distillation is another method), a kind
        without denoising steps, an unknown divergence, rounds that do not
        halve N0 to an integer, checkpoints that miss a round's end.
    """
    d, t = config.distill, config.training
    train.check_intervals(t)  # divisors below
    if not (isinstance(d.round_steps, int) and d.round_steps >= 1):
        raise ValueError(
            f"distill.round_steps={validate.shown(d.round_steps)} must be an integer >= 1 (training steps a round)"
        )
    kind = kinds.get(config)
    if config.graph.type != "absorbing":
        raise ValueError(
            f"sedd distill needs graph.type='absorbing' (the teacher has {config.graph.type!r}): "
            "distillation through time matches the absorbing graph's steps; the uniform graph's "
            "few-step method is DUO's consistency distillation, not implemented here"
        )
    if not d.teacher:
        raise ValueError("distill.teacher is empty: sedd distill --teacher RUN fills it in")
    capabilities.able(kind, capabilities.Distills, "sedd distill")
    if d.divergence not in sdtt.DIVERGENCES:
        raise ValueError(f"distill.divergence={d.divergence!r}; expected one of {', '.join(sdtt.DIVERGENCES)}")
    if d.target not in sdtt.TARGETS:
        raise ValueError(f"distill.target={d.target!r}; expected one of {', '.join(sdtt.TARGETS)}")
    if d.order not in ORDERS:
        raise ValueError(f"distill.order={d.order!r}; expected one of {', '.join(ORDERS)}")
    length = config.data.seq_len
    if d.order != "random" and kind.noise_groups(None)[0] != length:
        raise ValueError(
            f"distill.order={d.order!r} is a planned order of the whole sequence; model.kind="
            f"{kind.name!r} denoises in blocks: use distill.order='random'"
        )
    if d.order != "random" and length % max(d.teacher_steps, 1):
        raise ValueError(
            f"distill.order={d.order!r} writes L / N positions a step: distill.teacher_steps="
            f"{d.teacher_steps} must divide data.seq_len={length}"
        )
    if not (1 <= d.rounds <= 16 and d.teacher_steps >= 2 and d.teacher_steps % 2**d.rounds == 0):
        raise ValueError(
            f"distill.rounds={d.rounds} halvings of distill.teacher_steps={d.teacher_steps} must "
            f"leave an integer number of steps >= 1: N0 must divide by 2^rounds"
        )
    if d.round_steps % t.ckpt_every:
        raise ValueError(
            f"training.ckpt_every={t.ckpt_every} must divide distill.round_steps={d.round_steps}, "
            "so that every round's student is saved"
        )
    if t.n_iters != d.rounds * d.round_steps:
        raise ValueError(
            f"training.n_iters={t.n_iters} must be distill.rounds x distill.round_steps = {d.rounds * d.round_steps}"
        )


def distill_config(teacher: str | Path, overrides=(), rounds: int | None = None) -> ml_collections.ConfigDict:
    """The config of a distillation of the run `teacher`: its config, the distill section, then `overrides`.

    Defaults set before the overrides: distill.rounds = ``DEFAULT_ROUNDS``,
    distill.teacher_steps = the teacher's sampling.steps, checkpoints, the
    validation estimate and keep_period once a round (every round's student
    is kept), a constant learning rate after the warmup. After them:
    `rounds` (--rounds), training.n_iters = rounds x round_steps,
    sampling.steps = N0 / 2^rounds, the teacher's checkpoint resolved.

    Raises:
      FileNotFoundError, RunError: the teacher is not a readable run.
      ValueError, KeyError: an override that does not fit, or changes the
        teacher's architecture (``ARCHITECTURE``); ``check_distillable``'s refusals.
    """
    teacher = Path(teacher).expanduser().resolve()
    base = runs.read_config(teacher)
    steps = checkpoints.checkpoint_manager(teacher).all_steps() if (teacher / runs.CHECKPOINTS).is_dir() else []
    if not steps:
        raise FileNotFoundError(f"{teacher} holds no checkpoint to distill; train it first with `sedd train`")
    c = ml_collections.ConfigDict(base.to_dict())
    d = c.distill
    d.teacher, d.teacher_step, d.teacher_steps = str(teacher), -1, base.sampling.steps
    d.rounds, d.divergence, d.target = DEFAULT_ROUNDS, DEFAULT_DIVERGENCE, DEFAULT_TARGET
    c.optim.schedule = "constant"
    c = config_lib.override(c, overrides) if overrides else c
    d = c.distill
    given = config_lib.given_keys(overrides)
    if rounds is not None:
        d.rounds = rounds
    # Every number as `sedd train` checks it (types, sizes: distill.rounds in [0, 16], round_steps >= 1), before
    # any arithmetic with it: distill.rounds = -3 made 2 ** -3 a float that ml_collections refused with a TypeError.
    runs.check_config(c, f"--teacher {teacher}" + " and the overrides" * bool(overrides))
    for key in ("ckpt_every", "eval_every"):  # once a round, unless given
        if f"training.{key}" not in given:
            c.training[key] = d.round_steps
    c.training.keep_period = d.round_steps
    c.training.n_iters = d.rounds * d.round_steps
    if d.teacher_step < 0:
        d.teacher_step = max(steps)
    elif d.teacher_step not in steps:
        raise FileNotFoundError(f"{teacher} has no checkpoint of step {d.teacher_step}; it has {sorted(steps)}")
    mine, its = config_lib.flat(c.to_dict()), config_lib.flat(base.to_dict())
    changed = [k for k in ARCHITECTURE if mine[k] != its[k]]
    if changed:
        raise ValueError(
            f"a distillation keeps its teacher's network and process; {', '.join(changed)} cannot "
            "change (a student is initialised from its teacher's weights)"
        )
    if d.teacher_steps >= 2 and d.teacher_steps % 2 ** max(d.rounds, 0) == 0:
        c.sampling.steps = d.teacher_steps // 2**d.rounds
    if ORDERS.get(d.order):
        c.sampling.sampler = ORDERS[d.order]
    check_distillable(c)
    runs.read_tokenizer(teacher, base.vocab_size)  # a regular file of the teacher's (sedd.files), before any work
    return c


def distill(
    config: ml_collections.ConfigDict, workdir: str | Path, quiet: bool = False, split_cpu: bool = False
) -> dict:
    """Distil (or resume distilling) into `workdir` with the config of ``distill_config``; the final figures.

    The teacher's tokenizer is copied into a new run directory first (the
    student reads the same ids). Then ``sedd.train.train`` with
    ``DistillTrainer``.

    Returns:
      ``sedd.train.train``'s dict, and "rounds": a list per round of
      {"round", "steps" (the student's sampling steps), "minutes" (of the
      training loop, from metrics.jsonl; None when not all of it ran in
      one process), "loss_nats_per_token" (the last logged divergence)}.
    """
    check_distillable(config)
    workdir = Path(workdir)
    runs.check_run_links(workdir)
    lead = jax.process_index() == 0
    with lock.writing(workdir, (runs.TOKENIZER, runs.CONFIG)) if lead else contextlib.nullcontext():  # train's too
        if not (workdir / runs.TOKENIZER).exists() and lead:  # read as a run is, never a link out
            teacher = Path(config.distill.teacher)
            try:
                files.copy(teacher / runs.TOKENIZER, workdir / runs.TOKENIZER, runs.MAX_TOKENIZER_BYTES, root=teacher)
            except (files.UnsafeFile, OSError) as e:
                raise runs.RunError(f"the teacher's {runs.TOKENIZER} was not copied: {e}") from None
        result = train.train(config, workdir, quiet=quiet, split_cpu=split_cpu, make_trainer=DistillTrainer)
    if not result.get("stopped"):
        result["rounds"] = round_figures(workdir, config)
    return result


def round_figures(workdir: str | Path, config) -> list[dict]:
    """Per round: its student's sampling steps, the loop's minutes it took, its last logged divergence.

    The minutes are differences of metrics.jsonl's elapsed_s at the rounds'
    last logged steps, None for a round whose steps a resume split (elapsed_s
    restarts with each process).
    """
    rows = [json.loads(line) for line in (Path(workdir) / runs.METRICS).read_text().splitlines() if line.strip()]
    d = config.distill
    out, before = [], 0.0
    for r in range(1, d.rounds + 1):
        inside = [row for row in rows if (r - 1) * d.round_steps < row["step"] <= r * d.round_steps]
        end = inside[-1] if inside else None
        monotone = all(b["elapsed_s"] >= a["elapsed_s"] for a, b in zip(inside, inside[1:]))
        minutes = (end["elapsed_s"] - before) / 60 if end and monotone and end["elapsed_s"] >= before else None
        out.append(
            {
                "round": r,
                "steps": d.teacher_steps >> r,
                "minutes": minutes,
                "loss_nats_per_token": end["loss_nats_per_token"] if end else math.nan,
            }
        )
        before = end["elapsed_s"] if end else before
    return out
