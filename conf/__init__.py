"""The engine's bundled configuration, installed as the package `cyclecrawl_conf` (pyproject.toml maps it to this
folder, so a wheel carries it as an editable install does): the documented defaults (`crawler.yaml`), the Great
Expectations suites (`expectations/`), Ivy's Maven settings and Spark's scheduler pools. Code reaches a file
through `crawler.config.bundled(name)`."""
