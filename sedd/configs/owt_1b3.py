"""A 1.3B-parameter DDiT on OpenWebText: the mesh path beyond the paper's sizes.

24 blocks x 2048 (16 heads of 128), L = 2048, batch 512, GPT-2 tokenizer;
1.41B parameters, 1.21B outside the vocabulary tables (GPT-3 XL's shape).
Sized for 64 devices of 40 GB with the weights, gradients and optimizer
state split over all of them (``mesh.fsdp = 64``; 8 sequences a device):
every layer recomputed in the backward pass (``model.remat = "layers"``),
the loss 128 positions at a time (``training.loss_chunk``), the vocabulary
padded to 50,304 rows so ``fsdp`` and ``tensor`` split it. Its memory plan
(docs/scaling.md):

    python experiments/benchmarks/bench.py memory --config owt_1b3 --mesh fsdp=64 --device_gib 40

Nothing of this size has been trained here: no accelerator was lent for it.
"""

from sedd.configs import owt_small


def get_config():
    """The owt_1b3 config: owt_small's recipe at 24 x 2048, L = 2048, on an fsdp mesh of 64."""
    c = owt_small.get_config()
    c.model.update(hidden_size=2048, n_layers=24, n_heads=16, cond_dim=256, remat="layers")
    c.data.seq_len = 2048
    c.training.batch_size = 512
    c.optim.lr = 2e-4  # GPT-3 XL's peak rate at this size
    c.mesh.update(data=1, fsdp=64)
    c.sampling.steps = 2048
    return c
