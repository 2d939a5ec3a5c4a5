"""The embedded broker: kombu's filesystem transport with an atomic publish and a reader that survives junk."""
from pathlib import Path

from kombu import Connection

import controlpanel.celery  # noqa: F401  (registers the transport alias)


def test_a_broken_message_file_is_set_aside_and_the_next_message_still_arrives(tmp_path):
    queue_dir = tmp_path / "queue"
    queue_dir.mkdir()
    options = {"data_folder_in": str(queue_dir), "data_folder_out": str(queue_dir), "polling_interval": 0.01}
    with Connection("filesystem://", transport_options=options) as conn:
        simple = conn.SimpleQueue("runs")
        (queue_dir / "00_broken.runs.msg").write_bytes(b"")  # what a half-written file looks like
        (queue_dir / "01_empty-object.runs.msg").write_bytes(b"{}")  # JSON, but not a message
        (queue_dir / "02_null.runs.msg").write_bytes(b"null")
        simple.put({"run": 1})
        message = simple.get(timeout=2)
        assert message.payload == {"run": 1}
        message.ack()
        simple.close()
    assert sorted(p.name for p in (tmp_path / "broken").iterdir()) == [
        "00_broken.runs.msg", "01_empty-object.runs.msg", "02_null.runs.msg"]
    assert list(queue_dir.iterdir()) == []
    assert not any(Path(tmp_path / "incoming").iterdir())
