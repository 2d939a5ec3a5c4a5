"""Acceptance tests of stage top-words (docs/PLAN.md). Agreed and protected: do not edit."""
from textstats import core


def test_most_frequent_first():
    assert core.top_words("b a b c b a", 2) == [("b", 3), ("a", 2)]


def test_words_are_lower_cased():
    assert core.top_words("The the THE cat", 1) == [("the", 3)]


def test_ties_are_alphabetical():
    assert core.top_words("pear apple fig apple pear fig", 3) == [
        ("apple", 2),
        ("fig", 2),
        ("pear", 2),
    ]


def test_ties_after_counts():
    assert core.top_words("z y x z y z", 3) == [("z", 3), ("y", 2), ("x", 1)]


def test_n_larger_than_the_vocabulary_returns_every_word():
    assert core.top_words("one two", 5) == [("one", 1), ("two", 1)]


def test_empty_text_and_zero_n():
    assert core.top_words("", 3) == []
    assert core.top_words("a b", 0) == []


def test_words_split_on_any_whitespace():
    assert core.top_words("a\tb\na  b", 1) == [("a", 2)]
