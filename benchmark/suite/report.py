"""Markdown report with plots from result files; the implementation is ``sglang_hybrid.bench.report``."""

from sglang_hybrid.bench.report import main

if __name__ == "__main__":
    main()
