"""Where the hybrid radix cache places resume points (checkpoints) along a prompt.

:func:`checkpoint_positions` chooses the positions (prompt end, branch points, aligned positions);
:func:`checkpoint_grid` the alignment every attention page size and recurrent chunk size shares.
The cache itself is :mod:`sglang_hybrid.mem_cache.hybrid_radix_cache` (docs/hybrid-cache.md).
"""

from __future__ import annotations

import math
from typing import List


def checkpoint_positions(
    prompt_len: int,
    resume_len: int,
    kv_hit_len: int,
    grid: int,
) -> List[int]:
    """Positions (tokens) at which a prefill should store a checkpoint.

    Few and valuable (issue #3, "Where checkpoints go"):

    * the **branch point**: the last ``grid``-aligned position inside the KV
      match when the KV match runs deeper than the resume point (a new request
      diverged from a cached path there, e.g. after a shared system prompt);
    * the **prompt end**, aligned down to ``grid``, so the next turn of a
      conversation resumes here and not one turn behind.

    Args:
        prompt_len: prompt length in tokens (>= 0).
        resume_len: where this request resumes (a resume point, ``grid``-aligned).
        kv_hit_len: length of the attention-KV match (>= ``resume_len``).
        grid: checkpoint grid = lcm(kernel chunk, page, DCP-widened page) (> 0).
    Returns:
        Sorted distinct positions in ``(resume_len, prompt_len]``.
    Raises:
        ValueError: on a non-positive grid or inconsistent lengths.
    """
    if grid <= 0:
        raise ValueError(f"grid must be > 0, got {grid}")
    if prompt_len < 0 or resume_len < 0 or kv_hit_len < 0:
        raise ValueError(f"lengths must be >= 0, got prompt_len={prompt_len} resume_len={resume_len} kv_hit_len={kv_hit_len}")
    if resume_len > prompt_len:
        raise ValueError(f"resume_len={resume_len} > prompt_len={prompt_len}")
    out = set()
    branch = (min(kv_hit_len, prompt_len) // grid) * grid
    if branch > resume_len:
        out.add(branch)
    end = (prompt_len // grid) * grid
    if end > resume_len:
        out.add(end)
    return sorted(out)


def checkpoint_grid(*sizes: int) -> int:
    """lcm of the kernel chunk, the page size and the DCP-widened page (all > 0)."""
    for s in sizes:
        if s <= 0:
            raise ValueError(f"grid sizes must be > 0, got {sizes}")
    g = 1
    for s in sizes:
        g = g * s // math.gcd(g, s)
    return g
