"""The whole suite against one server, then the report (make bench); the implementation is ``sglang_hybrid.bench.suite``."""

import sys

from sglang_hybrid.bench.suite import main

if __name__ == "__main__":
    sys.exit(main())
