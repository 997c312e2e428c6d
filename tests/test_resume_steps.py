"""The step a resumed run continues from, and how many steps it repeats (gflowdist.runtime.generations)."""

from __future__ import annotations

import json

from gflowdist.rundir import checkpoint_name, checkpoint_step
from gflowdist.runtime.generations import PROGRESS_FILE, Reach, generation_note


def test_the_step_comes_from_the_name_of_a_periodic_checkpoint_and_the_manifest_of_a_final_one():
    assert checkpoint_step(checkpoint_name(0, 15), {"steps": {"0": 99}}) == 15
    assert checkpoint_step(checkpoint_name(0), {"steps": {"0": 20, "1": 20, "2": 0}}) == 20
    assert checkpoint_step(checkpoint_name(0), {}) is None  # a manifest that does not say


def test_progress_json_holds_the_last_step_once_flushed_however_fast_the_steps_came(tmp_path):
    reach = Reach(tmp_path, generation=0)
    for step in range(1, 21):  # 20 steps well within one write interval
        reach.note(0, step)
        reach.note(1, step)
    reach.flush()  # the end of the generation, or its failure
    assert json.loads((tmp_path / PROGRESS_FILE).read_text()) == {"generation": 0, "steps": {"0": 20, "1": 20}}
    assert Reach(tmp_path, generation=1).before == 20


def test_a_progress_file_that_cannot_be_written_does_not_end_the_run(tmp_path, caplog):
    (tmp_path / PROGRESS_FILE).mkdir()  # os.replace onto a directory fails
    reach = Reach(tmp_path, generation=0)
    reach.note(0, 3)
    reach.flush()
    assert "cannot write" in caplog.text and str(tmp_path / PROGRESS_FILE) in caplog.text


def test_the_generation_line_says_the_checkpoint_step_and_the_steps_done_after_it():
    assert generation_note(1, None, checkpoint_name(0), 20, 20) == (
        "generation 1 (resumed); resumed from gen-0000-final at step 20, 0 steps repeated"
    )
    assert generation_note(1, None, checkpoint_name(0, 15), 15, 21).endswith("at step 15, 6 steps repeated")
    assert generation_note(1, None, checkpoint_name(0, 15), 15, 16).endswith("at step 15, 1 step repeated")
