"""Closed-loop windows at several concurrencies (abbench); the implementation is ``sglang_hybrid.bench.abbench``."""

import sys

from sglang_hybrid.bench.abbench import main

if __name__ == "__main__":
    doc = main()
    sys.exit(0 if doc["manifest"]["request_stats"]["errors"]["count"] == 0 else 1)
