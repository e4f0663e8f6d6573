"""text8 (first 100M characters of Wikipedia, 27 symbols): SEDD's character benchmark.

Expects `text8.zip` at data.path (https://mattmahoney.net/dc/text8.zip).
Sized like SEDD/MD4's text8 runs (12 x 768, L = 256) but trainable on one GPU.
"""

from sedd.configs import shakespeare_char


def get_config():
    """The text8 config: a 12 x 768 DDiT on text8 characters."""
    c = shakespeare_char.get_config()
    c.model.update(hidden_size=768, n_layers=12, n_heads=12, cond_dim=128, dropout=0.0, dtype="bfloat16")
    # Memory: sized for one 80 GB device: the weight matmuls' outputs kept and the rest of each
    # block recomputed, 29.9 GiB on `bench.py memory --config text8` (72.3 without; docs/scaling.md).
    c.model.remat = "dots"
    c.data.update(name="text8", path="text8.zip", seq_len=256)
    c.training.update(batch_size=256, n_iters=400_000, ema=0.9999, eval_every=10_000, ckpt_every=5_000)
    c.optim.lr = 3e-4
    c.optim.warmup = 2500
    c.optim.schedule = "constant"
    c.optim.optimizer = "adamw"  # as SEDD's and MD4's text8 runs (Muon is measured on the CPU default only)
    c.model.normalize = False  # SEDD's score output, as its text8 runs
    c.sampling.steps = 256
    c.sampling.sampler = "analytic"  # SEDD's Tweedie sampler, as the field's text8 samples
    return c
