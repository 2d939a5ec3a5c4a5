"""The Control Panel of several hosts reads a run's records from the host's var directory mounted
beside its own (CP_OTHER_VAR_DIRS, engine/steps/paths.py ``var_path``). A hostile agent writes in its
run's scratch folders on its host's disk: nothing it plants there, or reaches with ``..``, may be
served as a record of any run."""
from pathlib import Path

from django.test import override_settings

from engine.steps.paths import var_path


def test_an_agents_scratch_file_on_another_host_is_never_served_as_a_record(tmp_path):
    mine, host_a = tmp_path / "web-var", tmp_path / "hosts" / "host-a"
    planted = host_a / "scratch" / "run-12" / "data"
    planted.mkdir(parents=True)
    (planted / "log.txt").write_text("forged by an agent")
    (host_a / "runs" / "13").mkdir(parents=True)
    (host_a / "runs" / "13" / "log.txt").write_text("the real record")
    with override_settings(VAR_DIR=mine, CP_OTHER_VAR_DIRS=[str(host_a)]):
        # a record is read from the host's disk
        assert var_path("runs/13/log.txt").read_text() == "the real record"
        # the agent's own folders are not records: never looked up elsewhere
        assert var_path("scratch/run-12/data/log.txt") == mine / "scratch/run-12/data/log.txt"
        # nor a path that climbs out of the records
        assert var_path("runs/../scratch/run-12/data/log.txt") == mine / "runs/../scratch/run-12/data/log.txt"
        assert not Path(var_path("runs/../scratch/run-12/data/log.txt")).exists()
