"""One glob dialect: gitignore patterns, matched as git matches them, by every path list.

Names that hold a newline, a tab, non-ASCII letters or brackets are matched the same by scope,
protection, documentation paths, exclusion and the validator; git itself is the reference.
"""
import os
import subprocess

import pytest

from engine import workspace
from engine.checks import globs, protected
from engine.pipeline.format import PipelineFormatError, validate

from .conftest import git, make_repo

NAMES = ["a.md", "docs/a.md", "x.md\n", "do\ncs/a.md", "data/x\ny.txt", "data/\ttab", "data/caf\u00e9.csv",
         "a[b].txt", "ab.txt", "[x]", "caf\u00e9.md", "dir\u00e9/f.py", "tests/test_a.py", "tests/sub/test_b.py",
         "src/tests/test_c.py", "README.md", "docs/README.md", "b*c", "x\n", "d\n/y", "tab\there/z.py",
         "notes/caf\u00e9.md", "notes/cafe\u0301.md", "a/b", "axb", "]", "\u00e9", "e\u0301", "trail\t", "nbsp\u00a0",
         "\u00e0"]
PATTERNS = ["*.md", "docs/*.md", "/*.md", "data/**", "**/test_*.py", "tests/**", "tests/", "a[b].txt",
            "a\\[b\\].txt", "[x]", "\\[x\\]", "README.md", "/README.md", "**", "*", "caf\u00e9.md", "x.md", "x", "d",
            "b\\*c", "tests/*.py", "data/x?y.txt", "tab?here/**", "d?/y", "data/*",
            # one byte per "?" and per class member, as git: a non-ASCII letter is two or more bytes
            "notes/caf?.md", "notes/caf??.md", "notes/cafe??.md", "?", "??", "e?", "[\u00e9]", "[!x]", "[^x]",
            "a[!x]b", "[]]", "[!]]", "*/", "**/", "/**/", "/*/", "trail\t", "nbsp\u00a0", "\u00e0", "*\u00a0",
            "[%--]", "tests/*/"]


def git_matches(repo, pattern: str) -> set[str]:
    """The untracked files of ``repo`` that git's own gitignore matcher takes for ``pattern``."""
    exclude = repo.parent / "exclude"
    exclude.write_text(pattern + "\n", encoding="utf-8")
    out = subprocess.run(["git", "ls-files", "-z", "-o", "-i", f"--exclude-from={exclude}"], cwd=repo,
                         capture_output=True, check=True).stdout
    return {os.fsdecode(p) for p in out.split(b"\0") if p}


@pytest.fixture(scope="module")
def tricky(tmp_path_factory):
    repo = tmp_path_factory.mktemp("globs") / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for name in NAMES:
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x", encoding="utf-8")
    return repo


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_engine_matches_every_name_as_git_does(tricky, pattern):
    assert {n for n in NAMES if globs.matches(n, [pattern])} == git_matches(tricky, pattern)


def test_the_old_dialects_disagreements_are_gone():
    # *.md matches at any depth, as it excludes at any depth (gitignore); [ is a class everywhere
    assert globs.matches("docs/a.md", ["*.md"]) and globs.matches("ab.txt", ["a[b].txt"])
    assert not globs.matches("a[b].txt", ["a[b].txt"]) and globs.matches("a[b].txt", ["a\\[b\\].txt"])
    assert globs.matches("data/x\ny.txt", ["data/**"]) and not globs.matches("x.md\n", ["*.md"])
    # the last matching pattern decides: a negation narrows
    assert globs.matches("tests/a.py", ["tests/**"]) and not globs.matches("tests/gen/a.py", ["tests/**", "!tests/gen/"])
    assert protected.is_test_file("tests/test_x.py") and not protected.is_test_file("tests/helper.py")


CASES = [  # (file name, a pattern naming it, a pattern that must not)
    ("data/x\ny.txt", "data/x?y.txt", "data/x.txt"),
    ("data/a\tb.txt", "data/a?b.txt", "data/a b.txt"),
    ("data/caf\u00e9.txt", "data/caf\u00e9.txt", "data/cafe.txt"),
    ("data/a[1].txt", "data/a\\[1\\].txt", "data/a[1].txt"),
]


@pytest.mark.parametrize("name, naming, other", CASES, ids=["newline", "tab", "non-ascii", "brackets"])
def test_scope_protection_documentation_exclusion_and_the_validator_agree(tmp_path, name, naming, other):
    repo = make_repo(tmp_path / "repo", {"README.md": "r\n", "data/keep.txt": "k\n", name: "old\n"})
    # the validator takes both patterns as they are (and would refuse an invalid one)
    doc = {"name": "p", "roles": {"implementer": "s", "reviewer": "s", "documenter": "s"},
           "profiles": {"s": {"adapter": "scripted", "scenario": {"stages": {}}}},
           "stages": [{"key": "a", "requirement": "r", "scope": [naming, other], "gates": ["true"]}],
           "protected_paths": [naming, other], "documentation_paths": [naming, other], "exclude": [naming, other]}
    result = validate(doc)
    assert result["stages"][0]["scope"] == [naming, other] and result["exclude"] == [naming, other]
    for patterns, expected in (([naming], True), ([other], False)):
        # scope and documentation paths
        assert (globs.outside([name], patterns) == []) is expected
        # protection, from the commit as the run snapshots it (the patterns alone; the folder rule
        # protects everything under data/ whichever pattern named it)
        chosen = protected.choose([name, "README.md"], patterns, [], folders=[])
        assert (name in chosen) is expected
        assert name in protected.choose([name, "README.md"], patterns, [])
        # exclusion, by git's matcher inside the manifest
        (repo / name).write_text("new\n", encoding="utf-8")
        data = workspace.manifest(str(repo), "main", patterns)
        assert (name in data["excluded"]) is expected, data["excluded"]
        assert any(c["path"] == name for c in data["changes"]) is (not expected)
        git(repo, "checkout", "-q", "--", ".")


@pytest.mark.parametrize("pattern, word", [
    ("src\\app.py", "'/'"), ("a\nb", "single line"), ("//etc/**", "relative"), ("../x", "'..'"),
    ("a//b", "empty folder"), ("#x", "comment"), ("!", "inside the repository"), ("/", "inside the repository"),
    ("[z-a]", "range"), ("notes/[9-0].txt", "range"), ("[[:alpha:]]", "[a-zA-Z]"), ("[\\]]", "inside [...]"),
    ("[x\\]", "inside [...]"), ("foo/***/baz", "whole folder segment"), ("foo**/baz", "whole folder segment"),
    ("tests/**/", "subfolders"), (" lead.txt", "white space"), ("data/*\t", "white space"), ("*.md\u00a0", "white space"), ("a\x01b", "control"),
])
def test_the_validator_names_the_problem(pattern, word):
    doc = {"name": "p", "roles": {"implementer": "s", "reviewer": "s", "documenter": "s"},
           "profiles": {"s": {"adapter": "scripted", "scenario": {"stages": {}}}},
           "stages": [{"key": "a", "requirement": "r", "scope": ["ok/**", pattern], "gates": ["true"]}]}
    with pytest.raises(PipelineFormatError) as info:
        validate(doc)
    [(_, field, problem)] = info.value.errors
    assert field == "stages[0].scope[1]" and word.lower() in problem.lower(), problem


def test_a_literal_folder_is_the_part_before_the_first_wildcard():
    assert globs.literal_folder("tests/test_*.py") == "tests/"
    assert globs.literal_folder("tests/unit/") == "tests/unit/"
    assert globs.literal_folder("/data/**") == "data/"
    assert globs.literal_folder("**/test_*.py") == "" and globs.literal_folder("conftest.py") == ""
    assert globs.literal_folder("!tests/x/**") == "" and globs.literal_folder("/pytest.ini") == ""


def test_the_engines_own_lists_are_patterns_of_the_same_dialect(tmp_path):
    """DEFAULT_EXCLUDES (applied by git) and TEST_FILE_PATTERNS (applied here) pass the validator,
    and this module matches the exclusions as git does."""
    for pattern in workspace.DEFAULT_EXCLUDES + list(protected.TEST_FILE_PATTERNS):
        assert globs.check(pattern) == pattern
    repo = tmp_path / "own"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    names = [".env", ".env.local", ".env.example", "a/.env.prod", "k.pem", "id_rsa.pub", "x/__pycache__/m.pyc",
             "m.pyc", ".venv/bin/python", "node_modules/x/i.js", "build/out.bin", "pkg.egg-info/PKG-INFO",
             "htmlcov/index.html", ".cp/s", "src/app.py", "tests/test_x.py", ".coverage", "a/.DS_Store"]
    for name in names:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("x", encoding="utf-8")
    exclude = tmp_path / "exclude"
    exclude.write_text("".join(p + "\n" for p in workspace.DEFAULT_EXCLUDES), encoding="utf-8")
    out = subprocess.run(["git", "ls-files", "-z", "-o", "-i", f"--exclude-from={exclude}"], cwd=repo,
                         capture_output=True, check=True).stdout
    by_git = {os.fsdecode(p) for p in out.split(b"\0") if p}
    assert {n for n in names if globs.matches(n, workspace.DEFAULT_EXCLUDES)} == by_git
    assert "src/app.py" not in by_git and ".env.example" not in by_git and ".env" in by_git
