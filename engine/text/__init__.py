"""What people read of what processes and agents said: an agent's conversation (``transcript.py``:
each CLI's stream normalized into entries, through its package's ``stream.py``), what happened to a
tool call in one word (``tool_outcomes.py``), a process's output as display text (``display.py``:
UTF-8, no ANSI escapes), text safe for an operator's terminal (``terminal.py``) and the commands printed
for a person to type next (``hints.py``). No Django."""
