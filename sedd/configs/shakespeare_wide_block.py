"""Block diffusion at `shakespeare_wide`'s width, started from an AR run of that width (its token shift).

The network of `shakespeare_wide` (1024 wide, 2 layers) as a block run of
b = 4 whose positions read the token before them (model.token_shift, Fast-dLLM
v2's shift): an AR run's weights start it (training.init_from), so it needs a
third of the AR run's steps, not a run of its own from scratch (a block step
reads 2L positions, about twice an AR step). Give the AR run to start from:

    sedd train --config shakespeare_wide --workdir runs/wide_head          # the AR run (with a draft head)
    sedd train --config shakespeare_wide_block --workdir runs/wide_block4 \\
        --config.training.init_from=runs/wide_head
    sedd sample --workdir runs/wide_block4 --sampler left_to_right          # several tokens a call where sure

Without init_from it trains from scratch, which at 150 steps writes little
more than noise. docs/block_diffusion.md ("From an AR run") says what the
shift does; docs/benchmarks.md's frontier says how fast and how well its
samplers write against the AR run's own decoding, and why.
"""

from sedd.configs import shakespeare_wide


def get_config():
    """shakespeare_wide's network as a token-shift block run of b = 4, to start from an AR run of that width."""
    return as_block(shakespeare_wide.get_config())


def as_block(c):
    """A wide AR config's network as a token-shift block run of b = 4 (``code_wide_block`` reads it too)."""
    c.model.kind = "block"
    c.model.block_size = 4  # small blocks: a block's lookahead is what a left-to-right decoder writes in parallel
    c.model.token_shift = True  # position p reads the token at p - 1: an AR run's weights start it
    c.model.time_conditioning = False  # as an AR network: the absorbing score needs no time input
    c.model.draft_head = 0  # the draft head is an AR run's (its weights are not read)
    c.training.draft_target = "data"
    c.training.n_iters = 150  # a third of the AR run's steps; a step reads [x_t ; x_0], twice an AR step's positions
    c.training.update(eval_every=150, ckpt_every=150)
    c.optim.lr = 1e-3  # half the default's peak: it starts from trained weights
    c.optim.warmup = 50
    c.sampling.sampler = "left_to_right"  # the first masked position and the sure ones after it
    c.sampling.steps = 4  # per block: at most one position a step where the network is unsure
    return c
