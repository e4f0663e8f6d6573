"""A tiny model for tests and smoke runs: compiles and trains in seconds on a CPU."""

from sedd.configs import shakespeare_char


def get_config():
    """The tiny config: the default shrunk to compile and train in seconds."""
    c = shakespeare_char.get_config()
    c.model.update(hidden_size=32, n_layers=1, n_heads=2, cond_dim=16)  # tests of depth set n_layers 2 or more
    c.data.seq_len = 32
    c.training.update(batch_size=8, n_iters=20, log_every=5, eval_every=10, ckpt_every=10, eval_batches=2)
    c.training.eval_samples = 0  # none at the evaluations during training (the final ones: one)
    c.optim.warmup = 5
    c.sampling.steps = 8
    # float32 whatever the machine: tests compare exact figures, and at these
    # sizes bfloat16 saves nothing (its own tests set model.dtype).
    c.model.dtype = "float32"
    return c
