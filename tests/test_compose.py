"""docker-compose.yml: two Run Engine hosts, PostgreSQL and Redis with passwords, one beat.

No container engine runs on this project's machines, so the file is not started here: it is held to
the compose-spec JSON schema (the copy check-jsonschema 0.39.0 vendors: ``vendor.compose-spec``), and
to what README.md, "Several hosts", says of it: each worker service is a host of its own (its own
CP_HOST_NAME and var volume), the web mounts each host's var volume where CP_OTHER_VAR_DIRS says,
no password has a default, and exactly one beat runs.
"""
import copy
import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _schema() -> dict:
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(vendored.read_text(encoding="utf-8"))


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))


def _errors(document: dict) -> list[str]:
    schema = _schema()
    validator = jsonschema.validators.validator_for(schema)(schema)  # the draft it names: 2020-12
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_the_file_follows_the_compose_spec_schema():
    assert _errors(_compose()) == []


def test_the_schema_check_can_fail():
    broken = copy.deepcopy(_compose())
    broken["services"]["worker-a"]["restrt"] = "always"  # a misspelt key
    broken["services"]["beat"]["ports"] = "8000"  # a string where a list belongs
    errors = _errors(broken)
    assert any("restrt" in e for e in errors) and any("ports" in e for e in errors), errors


def _mount(volume: str) -> tuple[str, str, str]:
    """``(source, target, mode)`` of a short volume syntax (a ``${VAR:-default}`` source included)."""
    mode = ""
    if volume.endswith((":ro", ":rw")):
        volume, mode = volume[:-3], volume[-2:]
    source, target = volume.rsplit(":", 1)
    return source, target, mode


def _workers(services: dict) -> dict:
    return {name: s for name, s in services.items() if "controlpanel worker" in str(s.get("command"))}


def test_each_worker_service_is_a_host_of_its_own():
    services = _compose()["services"]
    workers = _workers(services)
    assert len(workers) == 2
    names = {s["environment"]["CP_HOST_NAME"] for s in workers.values()}
    assert len(names) == 2
    var_volumes = set()
    for service in workers.values():
        var = service["environment"]["CP_VAR_DIR"]
        mounted = [source for source, target, _ in map(_mount, service["volumes"]) if target == var]
        assert len(mounted) == 1, service["volumes"]
        var_volumes.add(mounted[0])
        assert service["environment"]["CP_HOST_REPOS"] == "/repos"
        assert "/repos" in {target for _, target, _ in map(_mount, service["volumes"])}
    assert len(var_volumes) == 2  # two disks
    # the web reads each host's disk where CP_OTHER_VAR_DIRS says, read-only
    web = services["web"]
    others = web["environment"]["CP_OTHER_VAR_DIRS"].split(":")
    web_mounts = {target: (source, mode) for source, target, mode in map(_mount, web["volumes"])}
    assert {web_mounts[path][0] for path in others} == var_volumes
    assert {web_mounts[path][1] for path in others} == {"ro"}


@pytest.mark.parametrize("service", ["postgres", "redis", "web", "worker-a", "worker-b", "beat"])
def test_no_password_has_a_default(service):
    text = json.dumps(_compose()["services"][service])
    assert "PASSWORD:-" not in text and "change-me" not in text
    assert "${CP_DB_PASSWORD:?" in text or "${CP_REDIS_PASSWORD:?" in text


def test_exactly_one_beat_runs():
    services = _compose()["services"]
    beats = [name for name, s in services.items() if "controlpanel beat" in str(s.get("command"))]
    assert beats == ["beat"]
    assert not any("-B" in str(s.get("command")).split() for s in services.values())
