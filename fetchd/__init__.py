"""The fetch daemon: asyncio fetchers that own host buckets through leases, fetch them politely and write WARC and
result files (the loopback site farm the tests and the demo fetch is the separate `sitefarm` package)."""
