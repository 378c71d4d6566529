"""Pure core of the crawl engine: no Spark, no network. Jobs and daemons share every rule from here."""
