"""The program spark-submit runs (see jobs/submit.py): the `crawl` command line inside a Spark application.

spark-submit puts this file's folder first on sys.path; it is removed so that the job modules here (parse,
report, ...) can never shadow a top-level module of the same name.
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != _here]

from jobs.cli import main  # noqa: E402  (after the sys.path fix above)

sys.exit(main())
