"""A run's checkpoints: orbax's manager of <run>/checkpoints, a train state restored (or the part of it asked for),
the newest that reads whole, and an unreadable one moved aside inside the run.

Each checkpoint is a step's train state (``sedd.train``: step, params, opt_state, ema, key, bad_step) with the
SHA-256 of each array (``sedd.files.CHECKSUMS``). ``restore`` reads some of its entries onto the shardings of a
target whatever mesh wrote it, and refuses what training never saves (a non-finite value, a flipped bit, another
network's shapes) in one line; checkpoints saved under an older layout (the layers' old name, a spec run's unused
MASK row) restore into today's network.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from sedd import files, validate

FOLDER = "checkpoints"
"""Where a run's checkpoints are: <run>/checkpoints/<step>."""


def checkpoint_manager(workdir: str | Path, config=None) -> ocp.CheckpointManager:
    """The orbax manager of workdir/checkpoints.

    With a config (training): saves every training.ckpt_every steps (orbax's
    save policy; ``save(..., force=True)`` saves at any step) and keeps the
    newest max_to_keep (at least the newest, which is whole: saves are
    synchronous), plus every keep_period-th. Without one: for reading, it
    creates nothing. The folder is walked first (``sedd.files.check_checkpoints``):
    orbax reads every step's metadata as it starts, and a FIFO there blocked it for ever.
    """
    files.check_checkpoints(Path(workdir) / FOLDER, workdir)
    if config is None:
        options = ocp.CheckpointManagerOptions(create=False)
    else:  # orbax's LatestN(0) deleted every checkpoint (check_training refuses 0 first)
        t, keep = config.training, ocp.checkpoint_managers.preservation_policy
        kept = [keep.LatestN(max(t.max_to_keep, 1))] + ([keep.EveryNSteps(t.keep_period)] if t.keep_period else [])
        options = ocp.CheckpointManagerOptions(  # orbax deletes only after the newer checkpoint is whole
            save_decision_policy=ocp.checkpoint_managers.save_decision_policy.FixedIntervalPolicy(t.ckpt_every),
            preservation_policy=keep.AnyPreservationPolicy(kept),
            enable_async_checkpointing=False,
        )
    with files.disk_errors(Path(workdir) / FOLDER, "made"):  # orbax makes a new run's folder
        return ocp.CheckpointManager(Path(workdir).absolute() / FOLDER, options=options)


def restore(manager: ocp.CheckpointManager, target: dict, step: int | None = None) -> dict:
    """Restore the entries of `target` from the train state saved at `step` (default: the newest).

    `target` is a dict of some of the train state's entries (all of them, or
    just {"ema": ...}) whose leaves are arrays or ``jax.ShapeDtypeStruct``s
    carrying concrete NamedShardings: orbax reads each device's shard of that
    layout, whatever mesh wrote the checkpoint. Entries not in `target` are
    not read. A checkpoint holding a non-finite value is corrupt: training
    never saves one. RuntimeError, naming the checkpoint, where it is corrupt or does not fit.
    """
    step = manager.latest_step() if step is None else step
    folder = Path(manager.directory) / str(step)
    try:
        tree = files.checkpoint_tree(folder / "state")
        old = files.holds_key(tree, files.OLD_LAYERS)  # saved before the rename
        saved = _as_saved(files.renamed(target, "layers", files.OLD_LAYERS) if old else target, tree)
        files.check_checkpoint_shapes(folder / "state", saved)
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), saved)
        args = ocp.args.PyTreeRestore(
            abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract), partial_restore=True
        )
        state = manager.restore(step, args=ocp.args.Composite(state=args))["state"]
        files.verify_checksums(folder, state, folder.parent.parent)  # first: a flipped bit, finite or not, by name
        if not bool(_all_finite([x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)])):
            raise ValueError("it holds non-finite values, which training never saves")
        state = files.renamed(state, files.OLD_LAYERS, "layers") if old else state
        if [x.shape for x in jax.tree.leaves(saved)] == [x.shape for x in jax.tree.leaves(target)]:
            return state
        return jax.tree.map(lambda x, t: x[: t.shape[0]] if x.shape != t.shape else x, state, target)
    except Exception as e:  # orbax raises many types for unreadable or mismatched files
        raise RuntimeError(  # one line: orbax's messages quote TensorStore specs over many lines
            f"could not restore the checkpoint of step {step} in {manager.directory}: {validate.one_line(e, 400)} It is "
            "corrupt or was written by an incompatible config. The run directory was left as it is; move it away "
            "or pass a new --workdir."
        ) from e


def _as_saved(target, tree):
    """`target` with each token embedding (``vocab_embed``) as the checkpoint's `tree` holds it where it holds more
    rows than the network embeds: a spec run with a draft head (until 2026-12-07) embedded a MASK id = V + 1 that
    nothing read, and loads as the AR run with a head it was (``sedd.config.migrate``); ``restore`` drops the row."""

    def leaf(path, x):
        node = tree
        for k in path:
            name = getattr(k, "key", getattr(k, "name", getattr(k, "idx", None)))
            node = node.get(name, node.get(str(name))) if isinstance(node, dict) else None
        shape = tuple(getattr(node, "shape", x.shape))
        more = "vocab_embed" in jax.tree_util.keystr(path) and len(shape) == len(x.shape) and shape[0] > x.shape[0]
        return jax.ShapeDtypeStruct(shape, x.dtype, sharding=x.sharding) if more and shape[1:] == x.shape[1:] else x

    return target if tree is None else jax.tree_util.tree_map_with_path(leaf, target)


@jax.jit
def _all_finite(leaves: list) -> jax.Array:
    """Whether every element of every array is finite: one program and one transfer, not two a leaf."""
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves] or [jnp.bool_(True)]))


def restore_newest(
    manager: ocp.CheckpointManager, target: dict, quarantine: str | Path | None = None
) -> tuple[dict, int]:
    """(state, step) of the newest checkpoint that reads whole, falling back to older ones.

    Each unreadable checkpoint (truncated, corrupt, killed mid-write) is named
    in a RuntimeWarning. With `quarantine` (training), it is also moved into
    that folder (kept, never deleted) so the resumed run can save its step
    again; without it nothing is touched.

    Raises:
      FileNotFoundError: there is no checkpoint.
      RuntimeError: none reads whole; the message gives each one's error.
    """
    steps = sorted(manager.all_steps(), reverse=True)
    if not steps:
        raise FileNotFoundError(f"{manager.directory} holds no checkpoint")
    skipped = []
    for step in steps:
        try:
            state = restore(manager, target, step)
        except RuntimeError as e:
            skipped.append((step, e.__cause__))
            continue
        for bad, err in skipped:
            moved = None if quarantine is None else move_inside(Path(manager.directory) / str(bad), Path(quarantine))
            warnings.warn(
                f"skipped the checkpoint of step {bad} in {manager.directory}: it cannot be read "
                f"({validate.one_line(err, 200)}){f'; moved to {moved}' if moved else ''}. Using step {step}.",
                RuntimeWarning,
                stacklevel=2,
            )
        if skipped and quarantine is not None:
            manager.reload()
        return state, step
    errors = "; ".join(f"step {s}: {validate.one_line(e, 300 // len(skipped) + 60)}" for s, e in skipped)
    raise RuntimeError(
        f"no checkpoint in {manager.directory} can be read ({errors}). The run directory was left as it is; "
        "move it away or pass a new --workdir."
    )


def move_inside(src: Path, folder: Path) -> Path:
    """Move src into folder (as folder/<src name>, `_` appended while taken), both inside src's run directory.

    The run directory is src's grandparent (``<run>/checkpoints/<step>``);
    neither src nor folder, nor the parents followed, may be a symbolic link,
    and folder must resolve to a child of the run directory: a move never
    reaches outside the run. A rename, never a copy.

    Raises:
      sedd.files.UnsafeFile: a link or a folder outside the run; nothing was moved.
    """
    run = src.parent.parent
    for path in (src, src.parent, folder):
        if path.is_symlink():
            raise files.UnsafeFile(
                f"{path} is a symbolic link (to {os.readlink(path)}); an unreadable checkpoint is moved "
                "only inside its run directory, so nothing was moved"
            )
    if folder.resolve().parent != run.resolve() or src.resolve().parent.parent != run.resolve():
        raise files.UnsafeFile(f"{folder} is not a folder of the run directory {run}; nothing was moved")
    files.check_folder(folder, "nothing was moved")
    with files.disk_errors(folder, "made"):
        folder.mkdir(exist_ok=True)
    if folder.is_symlink() or not folder.is_dir():  # made by someone else between the check and here
        raise files.UnsafeFile(f"{folder} is not a folder of the run directory {run}; nothing was moved")
    dest = folder / src.name
    while dest.exists() or dest.is_symlink():
        dest = dest.with_name(dest.name + "_")
    with files.disk_errors(dest, "moved there"):
        os.rename(src, dest)  # both in the run: one file system, a rename that follows no link
    return dest
