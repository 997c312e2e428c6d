"""devices.json of a real run: every rank's device and how its agent group averaged (runtime.device_record).

The run is on the ``local`` engine (ranks as threads of this process, tests/support/local_jobs.py): what is
recorded follows from the engine the run names, whatever it is."""

from __future__ import annotations

from gflowdist.devices import HOST_ENGINES
from tests.support.jobs import read_json


def test_a_run_names_its_devices_and_its_averaging_in_the_run_directory(local_job_factory):
    job = local_job_factory("-n", "4", "run.steps=6", "launch.devices=cpu")  # trainers 0-1, buffer 2, coordinator 3
    assert job.wait(120) == 0, job.output
    run = job.run_dir()
    record = read_json(run / "devices.json")
    assert record["devices"] == {str(r): "cpu" for r in range(4)}
    (group,) = record["averaging"]
    assert group["ranks"] == [0, 1] and group["path"] == "host"
    assert group["engine"] == HOST_ENGINES[record["engine"]]
    assert group["reason"] == "every trainer of the group computes on the CPU"
    assert "averages through" not in (run / "report.txt").read_text()  # a CPU-only run's report is unchanged
    log = (run / "logs" / "rank-0.log").read_text()
    assert "agent group 0 averages through host memory on " in log
