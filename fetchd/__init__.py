"""Fetch daemons: asyncio fetchers that own host buckets, plus the loopback site farm used by tests and the demo."""
