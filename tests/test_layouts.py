"""Layouts timed on the device and kept in layouts.json (``sedd.kinds.layouts``): what sedd stores it reads again.

``choose`` is run with a stand-in sampler (no network: the timing is what is tested), so every case is cheap:
the fastest candidate is kept and read back; an entry that is not one of the run's candidates, a file sedd did
not write, or a link at its name is timed again and written over (never a reason to stop sampling); a folder it
cannot write still samples.
"""

from __future__ import annotations

import json
from unittest import mock

import jax.numpy as jnp
import numpy as np

from sedd.kinds import layouts, spec

CANDIDATES = spec.candidates(2)  # 2,1  1,2  0,0


def _sample(layout, seed):
    """A stand-in for a kind's sampler: texts of 4 tokens in layout.k + 1 calls less than 4 (any positive count)."""
    return jnp.zeros((1, 4), jnp.int32), {"nfe_per_sample": np.asarray([max(1, 4 - layout.k)])}


def _choose(workdir):
    return layouts.choose(CANDIDATES, _sample, length=4, batch=1, dtype=jnp.float32, workdir=workdir)


def test_the_fastest_candidate_is_kept_and_read_back(tmp_path):
    layout, line = _choose(tmp_path)
    assert layout in CANDIDATES and "the fastest here at batch 1" in line, line
    (entry,) = json.loads((tmp_path / layouts.LAYOUTS_FILE).read_text()).values()
    assert entry["layout"] == layout.name == entry["timed"][0]["layout"]
    assert {r["layout"] for r in entry["timed"]} == {lay.name for lay in CANDIDATES}
    assert all(r["tokens_per_s"] > 0 and 1 <= r["tokens_per_call"] <= 4 for r in entry["timed"])
    again, line = _choose(tmp_path)
    assert again == layout and "chosen earlier on this device" in line, line


def test_an_entry_the_run_cannot_use_is_timed_again_and_written_over(tmp_path):
    """Was: `sedd sample --draft_k 8` on a run trained with k = 4 stored "8,1", and every later sample refused the
    file until a person deleted it. An entry that is not one of the run's candidates (a layout past its k, one
    not timed beside the others, not a layout at all), or a file that is not sedd's, is timed again."""
    path, where = tmp_path / layouts.LAYOUTS_FILE, layouts.device_key(jnp.float32, 1)
    timed = [{"layout": lay.name} for lay in CANDIDATES]
    for bad in ({"layout": "8,1", "timed": timed}, {"layout": "64,65"}, {"layout": "1,2"}, {"layout": 7}, "x"):
        path.write_text(json.dumps({where: bad, "another device": {"layout": "1,2"}}))
        layout, line = _choose(tmp_path)
        assert "named another layout for this device" in line and "the fastest here" in line, line
        saved = json.loads(path.read_text())
        assert saved[where]["layout"] == layout.name and saved["another device"] == {"layout": "1,2"}
    for text in ("{not json", "[" * 100_000):  # not JSON, or too deep to parse
        path.write_text(text)
        layout, line = _choose(tmp_path)
        assert "was not a layouts file sedd wrote" in line and "timed again" in line, line
        assert json.loads(path.read_text())[where]["layout"] == layout.name


def test_a_link_at_its_name_is_replaced_and_what_it_points_to_untouched(tmp_path):
    run, victim = tmp_path / "run", tmp_path / "victim"
    run.mkdir()
    victim.write_text("the user's")
    (run / layouts.LAYOUTS_FILE).symlink_to(victim)
    layout, line = _choose(run)
    assert "timed again" in line and victim.read_text() == "the user's"
    assert not (run / layouts.LAYOUTS_FILE).is_symlink() and json.loads((run / layouts.LAYOUTS_FILE).read_text())


def test_a_folder_it_cannot_write_still_samples(tmp_path):
    """A received run one may read but not write: the choice is used, not kept (a refused write, as root too)."""
    with mock.patch.object(layouts.files, "write_text", side_effect=PermissionError(13, "Permission denied")):
        layout, line = _choose(tmp_path)
    assert layout in CANDIDATES and "not kept in" in line and not (tmp_path / layouts.LAYOUTS_FILE).exists(), line
