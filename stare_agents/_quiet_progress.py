"""Progress bars written to a log file redraw at most every 5 s, not 10 times a second.

The command line imports this module before anything that imports tqdm: tqdm reads `TQDM_MININTERVAL` when it
is imported, and Ray workers started later inherit it. A terminal keeps tqdm's default; a value set by the
user is kept.
"""

from __future__ import annotations

import os
import sys


def quiet_progress_bars() -> None:
    if not sys.stderr.isatty():
        os.environ.setdefault("TQDM_MININTERVAL", "5")


quiet_progress_bars()
