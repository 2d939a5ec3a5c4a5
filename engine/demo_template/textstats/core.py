"""Text statistics.

To be implemented, one stage at a time (see docs/PLAN.md):

- ``word_count(text) -> int``: the number of whitespace-separated words in ``text``.
- ``top_words(text, n) -> list[tuple[str, int]]``: the ``n`` most frequent lower-cased
  words with their counts, most frequent first, ties in alphabetical order.
"""
