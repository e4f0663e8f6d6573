"""Code: a character-level model of this Python's standard library (tests left out).

The corpus is on every machine that runs sedd (`sedd.data.sources`): about
730 non-test modules, 12M characters, 222 distinct characters on CPython
3.11; nothing is downloaded. Characters keep indentation and newlines
exactly, and the positions a denoiser can be sure of (indentation, closing
brackets, keywords, names already in scope) are single tokens
(docs/code.md says why characters and not BPE at this size).

Sized like the default (4 x 128 DDiT, Muon) with twice its context, so a
sample holds a few statements: L = 256 characters, 16 sequences a batch
(the default's 4,096 characters a step), 1,000 steps: a step costs a little
more than the default's (the attention over 256 positions), so the run takes
about the default's time. The block and AR kinds train with the same settings:

    sedd train --config code --workdir checkpoints/code
    sedd train --config code --config.model.kind=ar --workdir checkpoints/code_ar
    sedd train --config code --config.model.kind=block --config.model.block_size=16 \\
        --config.training.n_iters=400 --workdir checkpoints/code_block16

(a block step costs more than the DDiT's, so 400 steps keep it within the
same time). docs/code.md has the study of the kinds and samplers, and their times.
"""

from sedd.configs import shakespeare_char


def get_config():
    """The code config: the default's model on the standard library's sources, L = 256."""
    c = shakespeare_char.get_config()
    c.data.update(name="code", seq_len=256)
    c.data.code.tests = False
    c.training.update(batch_size=16, n_iters=1000, eval_every=500, eval_samples=1)
    c.sampling.steps = 256  # the EB-sampler at one step a character: its best text
    return c
