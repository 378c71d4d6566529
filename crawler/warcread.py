"""Read one WARC record at a known offset and decode its HTTP payload — streaming, bounded, pure.

The fetched-results files point at each response record by (file, offset, length); parse seeks there and reads
exactly one record, so a WARC file is never read whole. Content-Encoding (gzip, deflate, br) and chunked
transfer are undone by warcio; the decoded payload is capped and flagged truncated past the cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import BinaryIO

from warcio.archiveiterator import ArchiveIterator

_CHUNK = 65536


@dataclass(frozen=True)
class WarcHttpRecord:
    record_type: str                   # "response", "revisit", ...
    target_uri: str | None
    status_code: int | None            # HTTP status of the response (None without HTTP headers)
    headers: Mapping[str, str] = field(default_factory=dict)  # HTTP response headers, names lowercased
    payload: bytes = b""               # decoded (Content-Encoding undone), at most max_bytes
    truncated: bool = False            # payload cut at max_bytes, or the encoded stream ended early
    record_id: str | None = None       # WARC-Record-ID as written (<urn:uuid:...>)
    date: str | None = None            # WARC-Date as written

    @property
    def content_type(self) -> str | None:
        return self.headers.get("content-type")


def read_record_at(fileobj: BinaryIO, offset: int, *, max_bytes: int) -> WarcHttpRecord:
    """The one WARC record starting at `offset` of a seekable binary stream.

    Raises ValueError when no record starts there (a bad offset, a corrupt or truncated file).
    """
    if offset < 0:
        raise ValueError(f"negative WARC offset {offset}")
    fileobj.seek(offset)
    try:
        record = next(iter(ArchiveIterator(fileobj, check_digests=False)), None)
    except Exception as exc:  # warcio raises several types for garbage at the offset
        raise ValueError(f"no WARC record at offset {offset}: {exc}") from exc
    if record is None:
        raise ValueError(f"no WARC record at offset {offset}")
    status_code: int | None = None
    headers: dict[str, str] = {}
    if record.http_headers is not None:
        code = record.http_headers.get_statuscode()
        status_code = int(code) if code and code.isdigit() else None
        for name, value in record.http_headers.headers:
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
    payload, truncated = _read_capped(record, max_bytes)
    return WarcHttpRecord(
        record_type=record.rec_type,
        target_uri=record.rec_headers.get_header("WARC-Target-URI"),
        status_code=status_code,
        headers=headers,
        payload=payload,
        truncated=truncated,
        record_id=record.rec_headers.get_header("WARC-Record-ID"),
        date=record.rec_headers.get_header("WARC-Date"),
    )


def _read_capped(record, max_bytes: int) -> tuple[bytes, bool]:
    """Decoded payload up to max_bytes; a stream that breaks after some data keeps what was decoded."""
    stream = record.content_stream()
    parts: list[bytes] = []
    size = 0
    while size <= max_bytes:
        try:
            chunk = stream.read(min(_CHUNK, max_bytes + 1 - size))
        except Exception as exc:  # a broken gzip/deflate/br stream or a cut record
            if not parts:
                raise ValueError(f"unreadable payload: {exc}") from exc
            return b"".join(parts), True
        if not chunk:
            return b"".join(parts), False
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)[:max_bytes], True
