"""Seeds files: one URL a line, optional tab-separated metadata, `#` comments and blank lines skipped.

    https://example.com/            priority=2.5    interval=86400
    https://example.org/news        3.0     3600         (bare positional: priority, then interval)
    https://example.net/feeds/sitemap.xml.gz    kind=sitemap   (a sitemap to fetch and read, not a page)

A bad line (invalid URL, unsupported scheme, bad or out-of-range metadata, out of scope, too long, not UTF-8) is
reported with its line number and reason and skipped; the rest is injected. A UTF-8 byte-order mark at the start of
the file is not part of the first seed. Pure: the inject job reads the file's bytes and calls this.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from crawler import urls
from crawler.config import MAX_DURATION_S
from crawler.scope import Scope

DEFAULT_PRIORITY = 1.0
_POSITIONAL = ("priority", "interval")
_KEYS = (*_POSITIONAL, "kind")
_KINDS = ("page", "sitemap")
UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class SeedEntry:
    url: str                    # canonical
    priority: float = DEFAULT_PRIORITY
    interval_s: int | None = None  # None: revisit.default_interval_s
    sitemap: bool = False       # kind=sitemap: fetched and parsed as a sitemap (crawler/sitemaps.py)


def is_skipped(line: str | bytes) -> bool:
    """Blank lines and `#` comments carry no seed (a line that is not UTF-8 is neither: it is reported)."""
    if isinstance(line, bytes):
        return False
    text = line.strip()
    return not text or text.startswith("#")


def split_lines(data: bytes) -> list[str | bytes]:
    """A seeds file's lines, split on "\\n" only: the text of each UTF-8 line, the raw bytes of a line that is not
    UTF-8 (one bad line, not a bad file). A byte-order mark at the start is dropped."""
    lines = data.removeprefix(UTF8_BOM).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    decoded: list[str | bytes] = []
    for raw in lines:
        try:
            decoded.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            decoded.append(raw)
    return decoded


def _priority(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"priority is not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"priority must be a finite number >= 0: {text!r}")
    return value


def _interval(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"interval is not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0 or value != int(value):
        raise ValueError(f"interval must be a whole number of seconds > 0: {text!r}")
    if value > MAX_DURATION_S:  # added to a time, like every duration of the config
        raise ValueError(f"interval must be at most {MAX_DURATION_S:.0f} seconds (a century): {text!r}")
    return int(value)


def parse_seed_line(line: str, scope: Scope | None = None) -> SeedEntry:
    """One seed line as a SeedEntry; raises ValueError with a reason a person can act on."""
    if is_skipped(line):
        raise ValueError("no URL on this line")
    fields = [f.strip() for f in line.strip().split("\t") if f.strip()]
    raw_url, metadata = fields[0], fields[1:]
    canonical = urls.canonicalize(raw_url)
    if scope is not None:
        canonical = scope.stored_url(canonical)
        reason = scope.reject_reason(canonical)
        if reason is not None:
            raise ValueError(reason)
    values: dict[str, str] = {}
    for position, item in enumerate(metadata):
        if "=" in item:
            key, value = (part.strip() for part in item.split("=", 1))
        elif position < len(_POSITIONAL):
            key, value = _POSITIONAL[position], item
        else:
            raise ValueError(f"unexpected metadata field {item!r}")
        if key not in _KEYS:
            raise ValueError(f"unknown metadata key {key!r} (expected priority=, interval= or kind=)")
        if key in values:
            raise ValueError(f"metadata key {key!r} given twice")
        values[key] = value
    priority = _priority(values["priority"]) if "priority" in values else DEFAULT_PRIORITY
    interval = _interval(values["interval"]) if "interval" in values else None
    kind = values.get("kind", "page")
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {', '.join(_KINDS)}: {kind!r}")
    return SeedEntry(canonical, priority, interval, kind == "sitemap")


def read_seeds(lines: Iterable[str | bytes], scope: Scope | None = None,
               ) -> tuple[list[SeedEntry], list[tuple[int, str, str]]]:
    """Good entries (deduplicated by canonical URL, first occurrence wins) and errors (line_no, text, reason); a
    bytes line is one `split_lines` could not decode."""
    entries: dict[str, SeedEntry] = {}
    errors: list[tuple[int, str, str]] = []
    for line_no, line in enumerate(lines, start=1):
        if isinstance(line, bytes):
            errors.append((line_no, line.decode("utf-8", "backslashreplace").rstrip("\r"), "not valid UTF-8"))
            continue
        text = line.rstrip("\r\n")
        if is_skipped(text):
            continue
        try:
            entry = parse_seed_line(text, scope)
        except ValueError as exc:
            errors.append((line_no, text, str(exc)))
            continue
        entries.setdefault(entry.url, entry)
    return list(entries.values()), errors
