"""Acceptance tests of stage word-count (docs/PLAN.md). Agreed and protected: do not edit."""
from textstats import core


def test_empty_text_has_no_words():
    assert core.word_count("") == 0


def test_whitespace_only_has_no_words():
    assert core.word_count("   \n\t  ") == 0


def test_one_word():
    assert core.word_count("hello") == 1


def test_words_are_separated_by_any_whitespace():
    assert core.word_count("  the quick\tbrown\n\nfox  ") == 4


def test_punctuation_stays_part_of_a_word():
    assert core.word_count("well, well... it's done!") == 4


def test_returns_an_int():
    assert type(core.word_count("a b c")) is int
