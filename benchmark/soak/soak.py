"""Soak / load test of a server on the tiny model; the implementation is ``sglang_hybrid.reliability.soak``.

    python benchmark/soak/soak.py --model-path models/kimi-k3-tiny --duration 300 --concurrency 32 \
        --out benchmark/results/<date>-soak-kimi-k3-tiny-cpu.json

Exit status 0 only if nothing was lost: no problems, server healthy after idle,
no leak report, every sampled output equal to the cold-cache reference (or a near tie).
"""

import sys

from sglang_hybrid.reliability.soak import main

if __name__ == "__main__":
    s = main(sys.argv[1:])["summary"]
    ok = (s["problems"] == 0 and s["healthy_after_idle"] and s["server_alive"] and s["leak_reports_in_log"] == 0
          and s["reference"] is not None and not s["reference"]["mismatches"])
    sys.exit(0 if ok else 1)
