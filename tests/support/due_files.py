"""`urls` rows spread over due times, and the table's files sorted by whether they can hold a row due at a moment:
for the tests that generate reads only the files that can (docs/architecture.md, "Table layout and why")."""

from __future__ import annotations

import os
from datetime import datetime
from urllib.parse import unquote, urlparse

from pyspark.sql import functions as F

from crawler import urls
from crawler.status import UrlSource, UrlStatus
from delta_tables import tables


def url_rows(host_key: str, pages: range, next_fetch_at: datetime, buckets: int) -> list[dict]:
    """Never-fetched `urls` rows of `host_key` (its pages `pages`), all due at `next_fetch_at`."""
    rows = []
    for page in pages:
        url = urls.canonicalize(f"{host_key}/page/{page}")
        rows.append({"url_id": urls.url_id(url), "url": url, "host_key": host_key,
                     "bucket": urls.bucket_of(host_key, buckets), "status": UrlStatus.UNFETCHED.value,
                     "source": UrlSource.SEED.value, "priority": 1.0, "next_fetch_at": next_fetch_at,
                     "fetch_interval_s": 86400})
    return rows


def remove_files_due_after(spark, root: str, moment: datetime) -> list[str]:
    """Delete from storage (not from the table's log) every `urls` file none of whose rows is due at `moment`: a
    job that opens one fails. Returns the paths deleted."""
    rows = (tables.table_df(spark, root, "urls").groupBy(F.col("_metadata.file_path").alias("path"))
            .agg((F.min("next_fetch_at") > F.lit(moment)).alias("none_due")).collect())
    gone = [unquote(urlparse(row["path"]).path) for row in rows if row["none_due"]]
    for path in gone:
        os.remove(path)
    return gone
