"""A trainer's device slips, end to end on the CPU (tests/jobs/device_roles.py): a model not on the
trainer's device is named at the first step with the parameter's name; an out-of-memory error in a
trainer is named with the rank, the step and the batch size, and the job ends as for any failure.

The jobs run on the ``local`` engine (ranks as threads of this process, tests/support/local_jobs.py): the
checks are the trainer loop's, whatever the engine."""

from __future__ import annotations

FAST = ["-n", "3", "run.steps=12", "params.n=8"]  # 1 trainer (rank 0), the buffer, the coordinator


def test_a_model_off_the_trainers_device_is_named_at_the_first_step(local_job_factory):
    job = local_job_factory(*FAST, "roles.trainer=device_roles.py:MisplacedTrainer")
    code = job.wait(120)
    out = job.output
    assert code != 0, out
    assert "MisplacedTrainer.model of trainer rank 0: parameter '1.weight' is on meta" in out, out
    assert "the trainer computes on cpu" in out, out
    assert job.no_process_left()
    metrics = (job.run_dir() / "metrics.jsonl").read_text() if (job.run_dir() / "metrics.jsonl").exists() else ""
    assert '"step": 1' not in metrics  # it stopped at its first step


def test_out_of_memory_in_a_trainer_names_rank_step_and_batch_size(local_job_factory):
    # no replay: each batch is the 8 fresh items of the rollout
    no_replay = "replay.replay_fraction=0"
    job = local_job_factory(*FAST, no_replay, "roles.trainer=device_roles.py:MemoryHungryTrainer", "params.oom_at=5")
    code = job.wait(120)
    out = job.output
    assert code != 0, out
    assert "trainer rank 0 ran out of memory on cpu at step 5 with a batch of 8 items" in out, out
    assert "Tried to allocate 20.00 GiB" in out, out
    assert job.no_process_left()
