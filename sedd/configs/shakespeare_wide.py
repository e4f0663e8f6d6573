"""A wide, shallow network of the plays on which self-speculation writes faster than AR on a 2-core CPU.

At the default's width a call on 5 positions costs 2.5 calls on one, so a
spec run's rounds cannot pay there. At width 1024 a call on up to 5
positions costs about one (it reads its weights from memory, as decoding a
large model does), so a round that keeps drafts writes more tokens a
second than AR on its KV cache. Its spec run drafts with a draft head
(model.draft_head = 256, ``sedd.kinds.spec_head``): after each call, from
the causal half's features and the token the verifier just wrote, 4
tokens a round for a twentieth of a call; trained on the causal half's
laws (training.draft_target = "causal"), what a draft is kept against.
docs/speculative.md ("Where self-speculation pays") has the curve and the
speed, and docs/studies/speculative.md the runs of this config: how long
they train and how fast each writes. Its runs model the plays worse than
the default's (2.46-2.51 bits/char against 2.06 for the default's AR run,
on a fifth of its tokens): a place to measure speed as a large model's
decoding has it, not a better model.

    sedd train --config shakespeare_wide --workdir runs/wide_spec          # model.kind = "spec", 25 min
    sedd train --config shakespeare_wide --workdir runs/wide_ar --config.model.kind=ar
    sedd sample --workdir runs/wide_spec                                   # ~1.9x runs/wide_ar's tokens/s
"""

from sedd.configs import shakespeare_char


def get_config():
    """The plays at width 1024, 2 layers, a spec run by default."""
    c = shakespeare_char.get_config()
    c.model.kind = "spec"  # self-speculation; "ar" trains the AR run it is measured against
    c.model.hidden_size = 1024  # from here a call on 5 positions costs about one at batch 1 (the curve)
    c.model.n_layers = 2  # half the weights of 4 to train; its curve as flat (5 positions: 1.14 calls; 4 layers 1.08)
    c.model.n_heads = 16  # head width 64
    c.model.draft_head = 256  # drafts from a head that reads the verifier's token: its 4 steps cost 0.05 of a call
    c.training.draft_target = "causal"  # the head learns the causal half's laws, what its drafts are kept against
    c.training.batch_size = 16  # 26M parameters: a step of 16 x 128 takes ~3.2 s on 2 cores
    c.training.n_iters = 450  # about 25 minutes on 2 cores, a fifth of the default's tokens
    c.training.eval_every = 450  # one evaluation, at the end
    c.training.ckpt_every = 450
    c.training.eval_batches = 2
    return c
