"""Claude Code: everything the Run Engine knows about it (engine/agents/registry.py).

``adapter.py`` runs it for one attempt and reads its output into the attempt's result;
``policy.py`` says what it may be given and reach (credential variables, provider hosts, the
options a profile's ``extra_args`` may pass).
"""
