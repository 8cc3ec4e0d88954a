"""AgentX-style concurrency sweep of the trace replay: tokens/s/GPU vs P90 interactivity; the implementation is ``sglang_hybrid.bench.sweep``."""

import sys

from sglang_hybrid.bench.sweep import main

if __name__ == "__main__":
    doc = main()
    sys.exit(0 if doc["manifest"]["request_stats"]["errors"]["count"] == 0 else 1)
