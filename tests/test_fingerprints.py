"""Content hash and SimHash rules."""

from __future__ import annotations

import base64
import hashlib
import re

import mmh3

from crawler.fingerprints import content_hash, hamming, simhash

ARTICLE = (
    "The city council met on Tuesday evening to discuss the new budget for the public library system. "
    "Members debated the cost of extending opening hours on weekends and hiring additional staff for the "
    "children's section, which has seen a large increase in visitors over the past two years. After a long "
    "discussion the council agreed to fund the extended hours for a trial period of six months and to review "
    "the attendance figures at the end of the trial before making a permanent decision."
)


def test_content_hash_matches_warc_payload_digest_format():
    expected = "sha1:" + base64.b32encode(hashlib.sha1(b"hello").digest()).decode()
    assert content_hash(b"hello") == expected
    assert content_hash(b"hello") == content_hash(b"hel" + b"lo")
    assert content_hash(b"hello") != content_hash(b"hello ")
    assert content_hash(b"") == "sha1:3I42H3S6NNFQ2MSVX7XZKYAYSCX5QBYJ"


def test_simhash_identical_and_normalized_text_is_equal():
    assert simhash(ARTICLE) == simhash(ARTICLE)
    assert simhash(ARTICLE) == simhash("  " + ARTICLE.upper().replace(" ", "\n  ") + "!!")


def test_simhash_small_edit_is_near_and_unrelated_text_is_far():
    edited = ARTICLE.replace("six months", "eight months")
    unrelated = (
        "Preheat the oven to two hundred degrees. Mix the flour, sugar and butter in a large bowl until the "
        "dough is smooth, then roll it out on a floured surface and cut it into small rounds. Bake the biscuits "
        "for twelve minutes or until golden, and let them cool on a wire rack before serving with tea."
    )
    assert 0 < hamming(simhash(ARTICLE), simhash(edited)) <= 10
    # Unrelated 64-bit SimHashes differ in ~32 bits (binomial, sd 4); near-duplicate thresholds are ~3.
    assert hamming(simhash(ARTICLE), simhash(unrelated)) >= 16


def test_simhash_fits_a_signed_int64_and_edge_cases_are_defined():
    values = [simhash(ARTICLE), simhash("a"), simhash("one two"), simhash(ARTICLE, shingle=1)]
    assert all(-(2**63) <= v < 2**63 for v in values)
    assert any(v < 0 for v in (simhash(f"text number {i} of many") for i in range(64)))
    assert simhash("") == 0
    assert simhash("  ... !!! ") == 0
    assert simhash("one two") == simhash("ONE, two.")


def test_hamming_handles_signed_values():
    assert hamming(0, 0) == 0
    assert hamming(-1, 0) == 64
    assert hamming(-1, 2**64 - 1) == 0
    assert hamming(0b1011, 0b0001) == 2


def _reference_simhash(text: str, shingle: int = 3) -> int:
    """The definition written plainly: \\w+ tokens of the lowercased text, mmh3.hash64's first half per shingle,
    a majority vote per bit, as a signed int64."""
    words = re.findall(r"\w+", text.lower())
    if not words:
        return 0
    grams = [words] if len(words) <= shingle else [words[i:i + shingle] for i in range(len(words) - shingle + 1)]
    hashes = [mmh3.hash64(" ".join(gram), signed=False)[0] for gram in grams]
    value = sum(1 << bit for bit in range(64) if 2 * sum((h >> bit) & 1 for h in hashes) > len(hashes))
    return value - (1 << 64) if value >= 1 << 63 else value


def test_simhash_is_its_plain_definition():
    """`simhash` hashes in batches and tokenizes chunk by chunk for speed; the value is the plain definition's."""
    texts = [ARTICLE, ARTICLE.upper(), "a", "one two", "don't stop: naïve café_au lait 12x ÉCOLE İstanbul ǅ x²",
             "a.b,c;d  e\u00a0f\u2003g\u3000h", "日本語のテキスト と 中文 文本", "snake_case and_more __dunder__",
             "tab\tnew\nline\x1cfile\x1fsep", "١٢٣ arabic-indic digits ٤٥", "e\u0301 combining"]
    for text in texts:
        for shingle in (1, 2, 3, 5):
            assert simhash(text, shingle) == _reference_simhash(text, shingle), (text, shingle)
    assert isinstance(simhash("lone \udc80 surrogate"), int)
