"""A wide, shallow AR network of the plays with a draft head, on which speculative decoding writes faster than
plain AR decoding on a 2-core CPU.

At the default's width a call on 5 positions costs 2.5 calls on one, so
rounds of drafts cannot pay there. At width 1024 a call on up to 5 positions
costs about one (it reads its weights from memory, as decoding a large model
does), so a round that keeps drafts writes more tokens a second than one
token a call on the KV cache. Its AR network has a draft head
(model.draft_head = 256, ``sedd.kinds.draft_head``) that drafts after each
call, from the network's features and the token the verifier just wrote, 4
tokens a round for a twentieth of a call; trained on the network's laws
(training.draft_target = "causal"), what a draft is kept against. Runs of
this config model the plays worse than the default's (2.46-2.51 bits/char
against 2.06 for the default's AR run, on a fifth of its tokens): a place to
measure speed as a large model's decoding has it, not a better model.
docs/speculative.md says what to expect; docs/studies/speculative.md has the
runs of this config, how long they train and how fast each writes.

    sedd train --config shakespeare_wide --workdir runs/wide_head
    sedd sample --workdir runs/wide_head                                  # rounds of the head's drafts
    sedd sample --workdir runs/wide_head --layout 0                       # the same law, one token a call
"""

from sedd.configs import shakespeare_char


def get_config():
    """The plays at width 1024, 2 layers, an AR run with a draft head."""
    c = shakespeare_char.get_config()
    c.model.kind = "ar"  # its drafts from the head below; --config.model.draft_head=0 trains the AR run alone
    c.model.hidden_size = 1024  # from here a call on 5 positions costs about one at batch 1 (the curve)
    c.model.n_layers = 2  # half the weights of 4 to train; its curve as flat (5 positions: 1.14 calls; 4 layers 1.08)
    c.model.n_heads = 16  # attention head width 64
    c.model.draft_head = 256  # a draft head that reads the verifier's token: its 4 steps cost 0.05 of a call
    c.training.draft_target = "causal"  # the head learns the network's laws, what its drafts are kept against
    c.training.batch_size = 16  # 26M parameters: a step of 16 x 128 takes ~3.2 s on 2 cores
    c.training.n_iters = 450  # a fifth of the default's tokens: ~25 min on 2 Zen 5 cores (bfloat16), 70-90 on Zen 3
    c.training.update(eval_every=450, ckpt_every=450, eval_batches=2)  # one evaluation, at the end
    return c
