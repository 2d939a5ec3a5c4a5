"""Git plumbing for the Run Engine: worktree and branch, status, manifest, patch, checkpoint.

In parts: ``core`` (the one git runner and its errors), ``repos``, ``index``, ``manifests``,
``patches``, ``checkpoints``, ``worktrees``; engine/workspace.py is the face the rest of the engine imports.

A mechanism module: it takes and returns plain values (strings, lists, dicts) and does not
import Django. Every git invocation goes through :func:`git` with an argument array (never a
shell), ``-c core.quotepath=false``, ``-z`` output wherever paths are parsed, no terminal
prompts and the C locale, so git's messages are stable and paths with spaces, non-ASCII
characters or newlines survive.

The original checkout is never modified: read-only questions are asked with
``--no-optional-locks`` (so ``git status`` does not even refresh its index), and the shared
repository state written is limited to run branches, the ``.git/worktrees/<id>`` entries this
module creates or proves stale, and the submodule initialisation git records for a worktree.

Facts about git used here were checked against git 2.39.5:

* ``git worktree list --porcelain -z`` (2.36+), ``git rev-parse --end-of-options`` (2.30+).
* ``git read-tree -m <tree>`` with a single tree keeps the stat information of index entries
  whose content matches the tree, so ``git add -A`` re-hashes only files that changed.
* ``git ls-files -c -i --exclude-from=<file>`` applies gitignore semantics (directory patterns,
  ``!`` negation) to tracked paths.
* ``git worktree remove --force`` removes a worktree with initialised submodules.
* ``%(trailers:key=<k>,valueonly)`` in ``git log --format`` (2.22+).

Errors are raised as :class:`WorkspaceError` with a stable ``code`` and a sentence a person
understands in ``message``.
"""
