"""Canonical URLs and the keys derived from them: url_id, host_key, bucket, registered domain.

Canonicalization is semantics-preserving only: WHATWG parsing (ada), lowercase scheme and
host, IDNA host, default port removed, fragment removed, dot-segments resolved, percent-encoding
normalized (uppercase hex, unreserved characters decoded), empty path -> "/". The query keeps its order
and repeats. User info (`user:pass@`) is dropped: a crawler never sends credentials a link carries, a
`good.example@10.0.0.1` URL shows its real host plainly, and `http://a@h/` is the same page as `http://h/`.
These functions are the single entry points; nothing else in the engine parses URLs.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import unicodedata
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase

import ada_url
import mmh3
from publicsuffixlist import PublicSuffixList

HTTP_SCHEMES = ("http", "https")

_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def normalize_percent_encoding(text: str) -> str:
    """Percent-encoding normal form: non-ASCII as UTF-8 %XX, uppercase hex, unreserved characters decoded,
    so `/%7efoo`, `/~foo` and `/%7Efoo` compare equal (canonical URLs and robots.txt rules both use it)."""
    if text.isascii():
        if "%" not in text:
            return text
        encoded = text
    else:
        encoded = "".join(ch if ord(ch) < 128 else "".join(f"%{b:02X}" for b in ch.encode("utf-8")) for ch in text)

    def fix(match: re.Match[str]) -> str:
        byte = int(match.group(1), 16)
        return chr(byte) if byte in _UNRESERVED else "%" + match.group(1).upper()

    return _PERCENT.sub(fix, encoded)


def canonicalize(url: str) -> str:
    """The canonical form of an absolute http(s) URL; raises ValueError (with the reject reason) on anything else."""
    canonical, reason = _canonical_or_reason(url)
    if canonical is None:
        raise ValueError(f"{reason}: {str(url)[:200]!r}")
    return canonical


def reject_reason(url: object, max_length: int | None = None) -> str | None:
    """Why a URL cannot enter the crawl (a short reason), or None when it canonicalizes (within max_length, if
    given). Never raises, whatever the input, so a job can record the reason instead of failing."""
    canonical, reason = _canonical_or_reason(url)
    if canonical is None:
        return reason
    if max_length is not None and len(canonical) > max_length:
        return "too long"
    return None


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_PORT = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:[/\\]*(?:[^/\\?#]*@)?(?:\[[^\]]*\]|[^/\\?#:]*):([^/\\?#]*)")
_C0_OR_SPACE = "".join(chr(c) for c in range(0x21))
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _canonical_or_reason(url: object) -> tuple[str | None, str]:
    """The one place that decides whether a URL canonicalizes: (canonical, "") or (None, reason)."""
    if not isinstance(url, str):
        return None, f"not a string ({type(url).__name__})"
    if not url.strip(_C0_OR_SPACE):
        return None, "empty URL"
    text = _usv(url)
    try:
        serialised = ada_url.normalize_url(text)  # one call into C; most URLs need nothing more than the fragment cut
    except ValueError:
        return None, _why_unparsable(url)
    canonical = _canonical_as_serialised(serialised)
    if canonical is not None:
        return canonical, ""
    parsed = ada_url.URL(text)
    scheme = parsed.protocol[:-1]
    if scheme not in HTTP_SCHEMES:
        return None, f"unsupported scheme {scheme[:20]!r}"
    if not parsed.hostname:
        return None, "no host"
    if not all(_valid_ace_label(label) for label in parsed.hostname.split(".") if label.startswith("xn--")):
        return None, "invalid IDNA host"
    try:
        parsed.hash = ""
        parsed.username, parsed.password = "", ""
        parsed.pathname = normalize_percent_encoding(parsed.pathname) or "/"
        if parsed.search:
            parsed.search = normalize_percent_encoding(parsed.search)
        return parsed.href, ""
    except ValueError:
        return None, "not a valid URL"


def _usv(text: str) -> str:
    """Lone surrogates become U+FFFD, as the standard's USVString conversion does (a valid pair stays one
    character); without this, such text cannot even be encoded for the parser."""
    if text.isascii():
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _valid_ace_label(label: str) -> bool:
    """An xn-- label must be real Punycode for a non-ASCII label already in mapped (NFKC, lowercase) form with
    no control, unassigned or private-use code points (UTS #46 validity, which ada does not check here)."""
    try:
        decoded = label[4:].encode("ascii").decode("punycode")
    except (UnicodeError, ValueError):
        return False
    if not decoded or decoded.isascii() or unicodedata.normalize("NFKC", decoded).lower() != decoded:
        return False
    return not any(unicodedata.category(ch) in ("Cc", "Cn", "Co", "Cs") for ch in decoded)


def _why_unparsable(url: str) -> str:
    """The most specific reason ada rejected a URL (scheme, control characters, port) for reports."""
    text = url.strip(_C0_OR_SPACE)
    scheme = _SCHEME.match(text)
    if scheme and scheme.group(1).lower() not in HTTP_SCHEMES:
        return f"unsupported scheme {scheme.group(1).lower()[:20]!r}"
    if _CONTROL.search(text):
        return "control characters"
    port = _PORT.match(text.replace("\t", "").replace("\n", "").replace("\r", ""))
    if port and port.group(1).isdigit() and int(port.group(1)) > 65535:
        return "port out of range"
    return "not a valid URL"


def resolve(base: str, href: str) -> str | None:
    """Resolve a link against its page URL; the canonical http(s) result, or None if there is none."""
    if not isinstance(base, str) or not isinstance(href, str):
        return None
    try:
        joined = ada_url.join_url(_usv(base), _usv(href))
    except ValueError:
        return None
    return _canonical_of_joined(joined)


def _canonical_of_joined(joined: str) -> str | None:
    """Canonical form of a URL ada has just serialised (`join_url`'s result). Most links need nothing more than
    the fragment cut (`already_canonical`); the rest go through the full rule, memoised, since a site's navigation
    resolves to the same URLs on every page and each ada component access is a call into C."""
    canonical = _canonical_as_serialised(joined)
    return canonical if canonical is not None else _canonical_of_unusual(joined)


def _canonical_as_serialised(serialised: str) -> str | None:
    """A URL ada serialised, without its fragment, when that is canonical as it stands (`already_canonical`);
    None when it needs the full rule."""
    cut = serialised.partition("#")[0]  # in a serialised URL the first "#" starts the fragment
    return cut if already_canonical(cut) else None


@functools.lru_cache(maxsize=1 << 16)
def _canonical_of_unusual(joined: str) -> str | None:
    return _canonical_or_reason(joined)[0]


def already_canonical(serialised: str) -> bool:
    """True when a URL as ada serialises it is canonical as it stands, judged on the text alone: an http(s) URL
    (ada lowercases the scheme, normalises host, port, path and dot-segments, and serialises ASCII only) with no
    fragment, no user info ("@"), no percent-escape to normalise ("%") and no IDNA label to check ("xn--").
    Anything else takes `_canonical_or_reason`; the tests hold the two equal on links of every form."""
    return (serialised.startswith(("http://", "https://")) and serialised.isascii() and "#" not in serialised
            and "@" not in serialised and "%" not in serialised and "xn--" not in serialised)


def strip_query_params(canonical_url: str, rules: Mapping[str, Sequence[str]]) -> str:
    """Drop the query parameters that `rules` names for this host (host glob -> parameter-name globs, both
    case-sensitive globs, host names being lowercase already). Not semantics-preserving in general, hence opt-in
    per host in config (scope.strip_query_params): session ids and trackers that make one page many URLs.
    The remaining parameters keep their order and repeats; an emptied query loses its "?"."""
    if not rules:
        return canonical_url
    parsed = ada_url.URL(canonical_url)
    names = [name for pattern, listed in rules.items() if fnmatchcase(parsed.hostname, pattern) for name in listed]
    if not names or not parsed.search:
        return canonical_url
    kept = [param for param in parsed.search[1:].split("&")
            if not any(fnmatchcase(param.split("=", 1)[0], name) for name in names)]
    parsed.search = "&".join(kept)
    return parsed.href


def parts(canonical_url: str) -> tuple[str, str, str, str]:
    """(host_key, host name, path, query without "?") of a canonical URL, with one parse at most: the rules that
    read several parts of every discovered URL (scope, traps, templates) take them from here."""
    if already_canonical(canonical_url):  # "scheme://host[:port]" then a path that starts with "/", no user info
        origin_end = canonical_url.index("/", canonical_url.index("//") + 2)
        origin, rest = canonical_url[:origin_end], canonical_url[origin_end:]
        authority = origin.partition("//")[2]
        host = authority if authority.endswith("]") else authority.rpartition(":")[0] or authority
        path, _, query = rest.partition("?")
        return origin, host, path, query
    parsed = ada_url.URL(canonical_url)
    return f"{parsed.protocol}//{parsed.host}", parsed.hostname, parsed.pathname or "/", parsed.search[1:]


def url_id(canonical_url: str) -> str:
    """128-bit MurmurHash3 of the canonical URL, as 32 lowercase hex digits (sorts and joins as text)."""
    return format(mmh3.hash128(canonical_url.encode("utf-8"), 0, signed=False), "032x")


def host_key(canonical_url: str) -> str:
    """scheme://host[:port] of a canonical URL (no user info): the unit of politeness."""
    parsed = ada_url.URL(canonical_url)
    return f"{parsed.protocol}//{parsed.host}"


def path_and_query(url: str) -> str:
    """Path plus query of an absolute URL (robots.txt matching, an HTTP request's target). ValueError if it is
    not a URL. (Asks ada for the two parts only: its URL object costs twice as much, per fetched page.)"""
    parts = ada_url.parse_url(url, attributes=("pathname", "search"))
    return (parts["pathname"] or "/") + parts["search"]


def host_name(canonical_url: str) -> str:
    return ada_url.URL(canonical_url).hostname


@functools.cache
def _public_suffixes() -> PublicSuffixList:
    # The list bundled with the publicsuffixlist package: loaded once per process, never downloaded.
    return PublicSuffixList()


@functools.lru_cache(maxsize=65536)  # a link batch repeats few hosts; bounded for workers seeing millions
def registered_domain(host: str) -> str:
    """The registrable domain of a host name, public-suffix aware: "a.b.example.co.uk" -> "example.co.uk".
    An IP address, a bare public suffix or a single-label name is its own registered domain."""
    host = host.lower().rstrip(".")
    try:
        ipaddress.ip_address(host.strip("[]"))
        return host
    except ValueError:
        pass
    return _public_suffixes().privatesuffix(host) or host


@functools.lru_cache(maxsize=65536)  # discovery asks once per discovered URL: a batch repeats few hosts
def host_domain(host_key_: str) -> str:
    """The registered domain of a host_key (scheme://host[:port]): what per-domain budgets group hosts by."""
    return registered_domain(ada_url.URL(host_key_).hostname)


def bucket_of(host: str, buckets: int) -> int:
    """The bucket of a host_key: mmh3 32-bit (unsigned) mod the configured bucket count."""
    return mmh3.hash(host.encode("utf-8"), 0, signed=False) % buckets


def in_scope(canonical_url: str, schemes: list[str], host_suffixes: list[str], max_length: int) -> bool:
    """Scope rules applied at injection and discovery (scheme, host suffix allow-list, length)."""
    if len(canonical_url) > max_length:
        return False
    origin, host, _, _ = parts(canonical_url)
    if origin.partition(":")[0] not in schemes:
        return False
    if not host_suffixes:
        return True
    return any(host == s or host.endswith("." + s) for s in (x.lstrip(".").lower() for x in host_suffixes))
