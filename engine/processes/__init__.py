"""The processes the engine starts and bounds: ``process.py`` runs one under its deadline with its
output captured (``capture.py``: bounded, redacted at capture) and its tree found by a marker and
stopped (``process_tree.py``); ``limits.py`` bounds a tree's processes and memory (cgroups or rlimits);
``worker_process.py`` starts and stops a Celery worker as ``make worker`` does. Plain Python: only
``limits.py`` reads Django's settings, where they are configured."""
