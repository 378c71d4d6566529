"""Content fingerprints: an exact content hash and a 64-bit SimHash for near-duplicate detection.

`content_hash` uses the WARC-Payload-Digest format ("sha1:" + base32 of the SHA-1), so a reader can compare it
with WARC digests by eye; note it is computed over the *decoded* payload (after Content-Encoding), so two
servers sending the same page gzip'd and plain get the same hash. `simhash` is signed so it fits a Spark
LongType column as is; `hamming` compares two of them.
"""

from __future__ import annotations

import base64
import hashlib
import re

import mmh3
import numpy as np

_BITS = 64
# What `simhash` computes, as the dedup index records it (crawler.dedup.IndexDefinition): a change to its tokens,
# shingles, hash or vote makes SimHashes incomparable with the stored ones, so it must change this name too.
SIMHASH_DEFINITION = "simhash64/mmh3-x64-128/word-shingles/v1"
_MASK = (1 << _BITS) - 1
_WORD = re.compile(r"\w+", re.UNICODE)


def content_hash(payload: bytes) -> str:
    """"sha1:" + base32 SHA-1 of the bytes: identical bytes always give the identical string."""
    return "sha1:" + base64.b32encode(hashlib.sha1(payload).digest()).decode("ascii")


def _to_signed(value: int) -> int:
    return value - (1 << _BITS) if value >= 1 << (_BITS - 1) else value


def tokens(text: str) -> list[str]:
    """Lowercase word tokens (`\\w+` of the lowercased text): punctuation and whitespace differences do not change a
    SimHash. Most whitespace-separated chunks are one word already (`str.isalnum` is `\\w` without "_"), so only
    the others go through the regular expression: the same tokens at about half the cost on page text."""
    words: list[str] = []
    for chunk in text.lower().split():
        if chunk.isalnum():
            words.append(chunk)
        else:
            words.extend(_WORD.findall(chunk))
    return words


def simhash(text: str, shingle: int = 3) -> int:
    """64-bit SimHash over `shingle`-word shingles (mmh3 64-bit per shingle), as a signed int64.

    A text shorter than one shingle is hashed as a single shingle of all its words; a text with no words at
    all has SimHash 0.
    """
    if shingle < 1:
        raise ValueError("shingle must be >= 1")
    words = [word.encode("utf-8", "surrogatepass") for word in tokens(text)]  # a lone surrogate hashes, never fails
    if not words:
        return 0
    if len(words) <= shingle:
        shingles = [b" ".join(words)]
    else:
        shingles = list(map(b" ".join, zip(*(words[i:] for i in range(shingle)), strict=False)))  # shorter tails end it
    # The 128-bit digest's first 8 bytes are mmh3.hash64's first half, little-endian: one C call per shingle and no
    # Python int per hash. One row of 64 bits per shingle (bit 0 first); a result bit is set where more shingles
    # have it set than not.
    digests = np.frombuffer(b"".join(map(mmh3.mmh3_x64_128_digest, shingles)), dtype=np.uint8).reshape(-1, 16)
    bits = np.unpackbits(digests[:, :8], axis=1, bitorder="little")
    majority = bits.sum(axis=0, dtype=np.int32) * 2 > len(shingles)  # int32: a count per bit, summed fast
    return _to_signed(int(np.packbits(majority, bitorder="little").view("<u8")[0]))


def hamming(a: int, b: int) -> int:
    """Bits that differ between two SimHashes (signed or unsigned 64-bit)."""
    return ((a ^ b) & _MASK).bit_count()
