"""The gated delta rule (KDA and GDN: per-channel or per-head decay), laid out like the sibling ops:

* ``naive.py``: the plain-torch oracle (recurrence, KDA / GDN gates and forms, group-scan reference, the
  wrappers' raw-input twins);
* ``gate.py``: gate kinds shared by kernels, plans and wrappers;
* ``plan.py``: the one place a kernel, tile and mode are chosen (``plan_recurrent``, ``plan_chunk``), from the
  tables ``recurrent/tiles.json`` and ``chunk/launch.json``;
* ``recurrent/``: decode and verify (``wrapper.gated_delta_recurrent_triton``; rules; Triton kernels);
* ``chunk/``: chunked prefill (``wrapper.gated_delta_chunk_triton``; chunk-64 launcher, group scan; rules;
  Triton kernels);
* ``dispatch.py``: Triton or torch per device, logged with the plan; ``ops.py``: start-up table entries and boot
  gates; ``slot_index.py``: index-tensor checks shared by the wrappers.
"""
