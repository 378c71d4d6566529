"""Canonical URLs and the keys derived from them: url_id, host_key, bucket.

Canonicalization is semantics-preserving only (DESIGN §3): WHATWG parsing (ada), lowercase scheme and
host, IDNA host, default port removed, fragment removed, dot-segments resolved, percent-encoding
normalized (uppercase hex, unreserved characters decoded), empty path -> "/". The query keeps its order
and repeats. These functions are the single entry points; nothing else in the engine parses URLs.
"""

from __future__ import annotations

import re

import ada_url
import mmh3

HTTP_SCHEMES = ("http", "https")

_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def normalize_percent_encoding(text: str) -> str:
    """Percent-encoding normal form: non-ASCII as UTF-8 %XX, uppercase hex, unreserved characters decoded,
    so `/%7efoo`, `/~foo` and `/%7Efoo` compare equal (canonical URLs and robots.txt rules both use it)."""
    encoded = "".join(ch if ord(ch) < 128 else "".join(f"%{b:02X}" for b in ch.encode("utf-8")) for ch in text)

    def fix(match: re.Match[str]) -> str:
        byte = int(match.group(1), 16)
        return chr(byte) if byte in _UNRESERVED else "%" + match.group(1).upper()

    return _PERCENT.sub(fix, encoded)


def canonicalize(url: str) -> str:
    """The canonical form of an absolute http(s) URL; raises ValueError on anything else."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("empty URL")
    try:
        parsed = ada_url.URL(url)
    except ValueError:
        raise ValueError(f"not a valid URL: {url[:200]!r}") from None
    scheme = parsed.protocol[:-1]
    if scheme not in HTTP_SCHEMES:
        raise ValueError(f"unsupported scheme {scheme!r}: {url[:200]!r}")
    if not parsed.hostname:
        raise ValueError(f"URL has no host: {url[:200]!r}")
    parsed.hash = ""
    parsed.pathname = normalize_percent_encoding(parsed.pathname) or "/"
    if parsed.search:
        parsed.search = normalize_percent_encoding(parsed.search)
    return parsed.href


def resolve(base: str, href: str) -> str | None:
    """Resolve a link against its page URL; the canonical http(s) result, or None if there is none."""
    if href is None:
        return None
    try:
        joined = ada_url.join_url(base, href)
    except ValueError:
        return None
    try:
        return canonicalize(joined)
    except ValueError:
        return None


def url_id(canonical_url: str) -> str:
    """128-bit MurmurHash3 of the canonical URL, as 32 lowercase hex digits (sorts and joins as text)."""
    return format(mmh3.hash128(canonical_url.encode("utf-8"), 0, signed=False), "032x")


def host_key(canonical_url: str) -> str:
    """scheme://host[:port] of a canonical URL (no user info): the unit of politeness."""
    parsed = ada_url.URL(canonical_url)
    return f"{parsed.protocol}//{parsed.host}"


def path_and_query(url: str) -> str:
    """Path plus query of an absolute URL (e.g. for robots.txt matching)."""
    parsed = ada_url.URL(url)
    return (parsed.pathname or "/") + parsed.search


def host_name(canonical_url: str) -> str:
    return ada_url.URL(canonical_url).hostname


def bucket_of(host: str, buckets: int) -> int:
    """The bucket of a host_key: mmh3 32-bit (unsigned) mod the configured bucket count."""
    return mmh3.hash(host.encode("utf-8"), 0, signed=False) % buckets


def in_scope(canonical_url: str, schemes: list[str], host_suffixes: list[str], max_length: int) -> bool:
    """Scope rules applied at injection and discovery (scheme, host suffix allow-list, length)."""
    if len(canonical_url) > max_length:
        return False
    parsed = ada_url.URL(canonical_url)
    if parsed.protocol[:-1] not in schemes:
        return False
    if not host_suffixes:
        return True
    host = parsed.hostname
    return any(host == s or host.endswith("." + s) for s in (x.lstrip(".").lower() for x in host_suffixes))
