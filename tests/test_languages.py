"""Language detection of a page's text (crawler/languages.py) on a labelled multilingual sample and on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pycld2
import pytest

from crawler.languages import _ISO_639_3, detect_languages

SAMPLE = Path(__file__).parent / "data" / "languages.jsonl"
MAX_CHARS = 1024  # conf/crawler.yaml's parse.language_max_chars


def _sample() -> list[dict]:
    return [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]


def _top(text: str) -> str | None:
    languages = detect_languages(text, MAX_CHARS)
    return languages[0]["code"] if languages else None


def test_top_language_of_every_labelled_text_in_the_sample():
    """docs/outputs.md reports this figure: 52 of 52 known-language texts (20 languages, 9 scripts) right."""
    known = [row for row in _sample() if row["lang"] is not None]
    assert len({row["lang"] for row in known}) >= 15
    wrong = [(row["lang"], _top(row["text"])) for row in known if _top(row["text"]) != row["lang"]]
    assert not wrong, wrong


def test_gibberish_digits_and_symbols_have_no_language():
    unknown = [row["text"] for row in _sample() if row["lang"] is None]
    assert len(unknown) == 3
    assert [detect_languages(text, MAX_CHARS) for text in unknown] == [None, None, None]


@pytest.mark.parametrize("text", ["", "   \n\t ", "0123456789 " * 50, "Hello", "\x00\x85\x9f" * 20],
                         ids=["empty", "whitespace", "digits", "one word", "controls"])
def test_no_or_too_little_text_has_no_language(text):
    assert detect_languages(text, MAX_CHARS) is None


def test_a_mixed_language_text_is_ranked_by_its_share():
    by_lang = {row["lang"]: row["text"] for row in _sample()}
    text = " ".join([by_lang["rus"]] * 4 + [by_lang["fra"]] * 2 + [by_lang["eng"]])
    languages = detect_languages(text, MAX_CHARS)
    assert [language["code"] for language in languages] == ["rus", "fra", "eng"]
    shares = [language["share"] for language in languages]
    assert shares == sorted(shares, reverse=True) and 0.9 <= sum(shares) <= 1.0


def test_only_the_first_max_chars_are_read():
    by_lang = {row["lang"]: row["text"] for row in _sample()}
    english = (by_lang["eng"] + " ") * 30
    long_text = english + (by_lang["deu"] + " ") * 5_000  # ~1 MB, German past the cut
    assert detect_languages(long_text, len(english)) == [{"code": "eng", "share": 0.99}]
    assert detect_languages(long_text, 0) is None  # parse.language_max_chars 0: detection off


def test_text_cld2_would_reject_is_cleaned_or_has_no_language():
    by_lang = {row["lang"]: row["text"] for row in _sample()}
    dirty = by_lang["eng"].replace(" ", " \x85\x01 ", 3) + "\ud800"  # C1/C0 controls and a lone surrogate
    assert _top(dirty) == "eng"
    assert detect_languages("\ufffe\uffff " + by_lang["eng"], MAX_CHARS) is None  # noncharacters: no languages


def test_every_language_cld2_detects_has_an_iso_639_3_code():
    cld2_codes = {code for name, code in pycld2.LANGUAGES if name in pycld2.DETECTED_LANGUAGES}
    assert cld2_codes - set(_ISO_639_3) == {"zzp"}  # CLD2's Pig Latin is no language
    assert all(len(code) == 3 and code.islower() for code in _ISO_639_3.values())
