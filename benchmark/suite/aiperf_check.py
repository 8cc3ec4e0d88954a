"""Our replay client and AIPerf on the same Mooncake trace slice, side by side; the implementation is ``sglang_hybrid.bench.aiperf_check``."""

import sys

from sglang_hybrid.bench.aiperf_check import main

if __name__ == "__main__":
    doc = main()
    sys.exit(0 if doc["manifest"]["request_stats"]["errors"]["count"] == 0 else 1)
