"""Code at width 1024: `shakespeare_wide`'s network, an AR run with a draft head, on `code`'s corpus.

The frontier at the width where a call on a few positions costs about one
(docs/benchmarks.md), on the corpus whose long sure stretches (indentation,
names in scope, closing brackets) a parallel decoder should find: the
standard library's sources, L = 256 characters. 8 sequences a batch keep
`shakespeare_wide`'s 2,048 characters a step, so its 450 steps take about
that run's time. Its block run starts from it (`code_wide_block`):

    sedd train --config code_wide --workdir runs/code_wide_head
    sedd train --config code_wide_block --workdir runs/code_wide_block4 \\
        --config.training.init_from=runs/code_wide_head
"""

from sedd.configs import code, shakespeare_wide


def get_config():
    """shakespeare_wide's AR network with its draft head, on code's corpus and context."""
    c = shakespeare_wide.get_config()
    c.data = code.get_config().data  # the standard library's sources, tests left out, L = 256
    c.training.batch_size = 8  # 8 x 256: shakespeare_wide's 2,048 characters a step
    return c
