"""SEDD small on OpenWebText: the paper's main model (Lou et al. 2024, App. C).

12 blocks x 768, L = 1024, batch 512, AdamW 3e-4, warmup 2500, EMA 0.9999,
log-linear noise, absorbing graph, GPT-2 tokenizer. data.path must name a local
copy of OpenWebText (a folder of .txt files or a .jsonl with a "text" field)
and data.tokenizer_path the GPT-2 tokenizer files (see docs/data.md).
"""

from sedd.configs import shakespeare_char


def get_config():
    """The owt_small config: SEDD small on OpenWebText with the GPT-2 tokenizer."""
    c = shakespeare_char.get_config()
    c.model.update(hidden_size=768, n_layers=12, n_heads=12, cond_dim=128, dropout=0.1, dtype="bfloat16")
    # Memory: sized for 8 devices of 40 GB or more, 64 sequences a device (mesh.data = -1 takes
    # them all): the loss 128 positions at a time, the weight matmuls' outputs kept and the rest
    # of each block recomputed, the vocabulary padded to 50,304 rows. 34.9 GiB a device on
    # `bench.py memory --config owt_small --mesh data=8` (docs/scaling.md), 151.9 before.
    c.model.remat = "dots"
    c.model.vocab_multiple = 128
    c.training.loss_chunk = 128
    c.data.update(name="openwebtext", path="openwebtext", tokenizer="gpt2", seq_len=1024)
    c.training.update(batch_size=512, n_iters=400_000, ema=0.9999, log_every=100, eval_every=10_000, ckpt_every=5_000)
    c.optim.lr = 3e-4
    c.optim.optimizer = "adamw"  # the original's plain AdamW
    c.optim.adaln_lr_scale = 1.0
    c.training.t_power = 0.0  # the original's uniform t
    c.model.normalize = False  # the original's score output
    c.optim.warmup = 2500
    c.optim.schedule = "constant"
    c.sampling.steps = 1024
    c.sampling.sampler = "analytic"  # the original's Tweedie sampler
    return c
