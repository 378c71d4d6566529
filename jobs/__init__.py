"""Spark jobs, one per crawl step, on one shared base (jobs.base)."""
