"""Fixtures shared by test modules."""

import pytest

from sedd import config as config_lib
from sedd import train


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A `tiny` run trained for 4 steps, checkpoints at steps 2 and 4: (workdir, data_dir).

    Read-only for its users: trained once per session.
    """
    tmp = tmp_path_factory.mktemp("tiny_run")
    config = config_lib.load_config("tiny", [f"--config.data.data_dir={tmp / 'data'}", "--config.training.n_iters=4",
                                             "--config.training.ckpt_every=2", "--config.training.eval_every=4"])
    train.train(config, tmp / "run", quiet=True)
    return tmp / "run", str(tmp / "data")
