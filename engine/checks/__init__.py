"""What verifies an agent's work, apart from running it: the protected checks an agent may not weaken
(``protected.py``, the files a gate runs found from its words, ``gate_files.py``), the one path-pattern
dialect of the pipelines (``globs.py``), what the test runner of a gate recorded (``test_reports/``,
loaded into the gate's own runner) and the independent review's prompt and verdict (``review.py``)."""
