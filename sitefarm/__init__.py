"""The site farm: a test and demo web server on loopback (many virtual hosts with scripted behaviours, its own
request log, and judges of politeness and robots read from that log). Not part of the fetch daemon: `crawl demo`,
`bench/` and the tests use it.

`sites` (with `traps`, `fresh` and `resources`) says what every host answers, `truth` what a correct crawl of them
fetches, `server` serves them and logs every request, `judge` finds a crawl's violations in that log."""
