"""Chunked prefill of the gated delta rule: ``wrapper.py`` (host wrapper, launches a ``plan.ChunkPlan``),
``parallel.py`` (the chunk-64 launcher), ``group_scan.py`` (its group-scan state pass), ``seq_plan.py`` (packed
sequence index tables), ``rules.py`` (launch tables from ``launch.json`` and their rules) and the Triton kernels
(``triton_chunk_parallel.py``, ``triton_chunk_group_scan.py``, ``triton_chunk.py``: the sequential form)."""
