"""A tiny model for tests and smoke runs: compiles and trains in seconds on a CPU."""

from sedd.configs import shakespeare_char


def get_config():
    """The tiny config: the default shrunk to compile and train in seconds."""
    c = shakespeare_char.get_config()
    c.model.hidden_size = 32
    c.model.n_layers = 1  # tests of depth set 2 or more
    c.model.n_heads = 2
    c.model.cond_dim = 16
    c.data.seq_len = 32
    c.training.batch_size = 8
    c.training.n_iters = 20
    c.training.log_every = 5
    c.training.eval_every = 10
    c.training.ckpt_every = 10
    c.training.eval_batches = 2
    c.training.eval_samples = 0  # none at the evaluations during training (the final ones: one)
    c.optim.warmup = 5
    c.sampling.steps = 8
    # float32 whatever the machine: tests compare exact figures, and at these
    # sizes bfloat16 saves nothing (its own tests set model.dtype).
    c.model.dtype = "float32"
    return c
