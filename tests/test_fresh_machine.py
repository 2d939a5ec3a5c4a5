"""CI's fresh-machine view (.ci/fresh_machine.py): what a fresh machine of this kind lacks is hidden
from the suites, so that a package installed by hand cannot make CI green."""
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fresh_machine", ROOT / ".ci" / "fresh_machine.py")
fresh_machine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fresh_machine)


def test_dependency_fields_are_groups_of_alternatives_without_versions():
    assert fresh_machine.groups("libc6 (>= 2.34), libcap2 | libcap2-bin:any (<< 3), ") == [
        ["libc6"], ["libcap2", "libcap2-bin"]]
    assert fresh_machine.groups("") == []


def package(depends: str = "", provides: str = "") -> dict:
    return {"depends": fresh_machine.groups(depends), "provides": {g[0] for g in fresh_machine.groups(provides)}}


def test_what_the_project_installs_keeps_the_dependencies_apt_chose():
    """Of a group of alternatives only the one apt would take is kept: none when the fresh machine
    (or the kept set) already has one, else the first installed. A hand-installed alternative that
    comes later, or is not needed, stays hidden."""
    packages = {"chromium": package("chromium-common, fonts-liberation | fonts"),
                "chromium-common": package("libc6, dbus-broker | dbus-daemon"),
                "fonts-dejavu-core": package(provides="fonts"),
                "fonts-liberation": package(),  # installed by hand, and the first alternative
                "dbus-daemon": package(), "dbus-broker": package(),  # dbus-daemon is on the fresh machine
                "libc6": package(), "bubblewrap": package("libc6, libcap2"), "libcap2": package()}
    present = frozenset({"libc6", "dbus-daemon"})
    kept = fresh_machine.closure(["chromium", "fonts-dejavu-core"], packages, present)
    assert kept == {"chromium", "chromium-common", "fonts-dejavu-core"}, kept  # the first group member kept...
    assert "dbus-broker" not in kept and "bubblewrap" not in kept and "libcap2" not in kept
    # ...is the one already kept: fonts-dejavu-core provides "fonts"; without it, the first installed
    assert "fonts-liberation" in fresh_machine.closure(["chromium"], packages, present)


def test_the_snapshot_names_a_fresh_machine_and_no_hand_installed_package():
    """The committed snapshot is read as sections; it holds none of the things this project must
    install itself (a fresh machine has none of them: that is the point of the check)."""
    found = fresh_machine.sections(fresh_machine.SNAPSHOT)
    assert {"debian", "npm-global", "path-folders", "files"} <= set(found)
    assert "git" in found["debian"] and "util-linux" in found["debian"]
    assert not {"bubblewrap", "chromium"} & found["debian"]
    assert not any(os.path.basename(path) in ("bwrap", "chromium", "claude", "codex", "gemini", "pi")
                   for path in found["files"])


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="hiding needs root and util-linux's unshare (CI has both)")
def test_a_program_copied_onto_path_by_hand_is_gone_for_the_command(tmp_path, monkeypatch, capfd):
    """A folder on PATH that a fresh machine does not have, with a program in it: ``run`` hides it
    (a whiteout: not found, not merely empty), while the machine itself keeps it."""
    folder = tmp_path / "hand-bin"
    folder.mkdir()
    tool = folder / "cp-hand-tool"
    tool.write_text("#!/bin/sh\necho hand-installed\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    hide, _ = fresh_machine.plan()
    assert str(tool) in hide["not on a fresh machine and no package's"]
    status = fresh_machine.run([sys.executable, "-c",
                                "import os, shutil; print(shutil.which('cp-hand-tool'), os.path.lexists(%r))"
                                % str(tool)])
    out = capfd.readouterr().out
    assert status == 0 and "None False" in out, out
    assert "fresh machine: hiding not on a fresh machine and no package's" in out
    assert subprocess.run(["cp-hand-tool"], capture_output=True, text=True).stdout == "hand-installed\n"


def test_variables_that_load_code_from_elsewhere_are_unset_for_the_command(monkeypatch, capfd, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("LD_PRELOAD", "")
    monkeypatch.setattr(fresh_machine, "plan", lambda: ({}, []))  # nothing to hide: no root needed
    status = fresh_machine.run([sys.executable, "-c", "import os; print(os.environ.get('PYTHONPATH'), "
                                                      "'LD_PRELOAD' in os.environ)"])
    out = capfd.readouterr().out
    assert status == 0 and "None False" in out, out
    assert "fresh machine: unsetting PYTHONPATH" in out and "fresh machine: unsetting LD_PRELOAD" in out


def test_the_pythons_standard_library_folders_and_the_user_site_are_watched(monkeypatch, tmp_path):
    """A sitecustomize.py dropped into a Python's standard-library folder runs in every Python built from it
    (a venv too); pip install --user writes into ~/.local: both are watched folders, one level deep."""
    home = tmp_path / "home"
    site = home / ".local" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (home / ".local" / "bin").mkdir()
    monkeypatch.setenv("HOME", str(home))
    folders = [folder for folder, _ in fresh_machine.watched()]
    assert str(site) in folders and str(home / ".local" / "bin") in folders, folders
    stdlib = sorted(glob.glob("/root/.pyenv/versions/*/lib/python3.*[0-9]"))
    assert all(os.path.realpath(folder) in folders for folder in stdlib), (stdlib, folders)
