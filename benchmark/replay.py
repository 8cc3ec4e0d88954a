"""Trace replay benchmark; the implementation is ``sglang_hybrid.bench.replay``."""

import sys

from sglang_hybrid.bench.replay import main

if __name__ == "__main__":
    summary = main()
    sys.exit(0 if summary.get("num_errors", 1) == 0 else 1)
