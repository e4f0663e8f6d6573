"""Block diffusion at `code_wide`'s width, started from an AR run of it: `shakespeare_wide_block` on code.

    sedd train --config code_wide --workdir runs/code_wide_head
    sedd train --config code_wide_block --workdir runs/code_wide_block4 \\
        --config.training.init_from=runs/code_wide_head
    sedd sample --workdir runs/code_wide_block4 --sampler left_to_right
"""

from sedd.configs import code_wide, shakespeare_wide_block


def get_config():
    """code_wide's network as a token-shift block run of b = 4, to start from an AR run of that width."""
    return shakespeare_wide_block.as_block(code_wide.get_config())
