"""Every binary a served chunked prefill can launch, and a warm-up that compiles them before serving.

:func:`~sgl_hybrid_kernel.delta_rule.plan.plan_chunk` picks a chunk plan from the batch's sequence lengths
(fused output or not, state value tile, group-scan mode) and from whether the call writes checkpoints; each
plan launches kernels with its own constexprs, so each is a Triton binary of its own. A server's first
requests reach only some of them; the others compiled when a later batch first selected them, inside a
served request (the first H200 system benchmark, 2026-12-07: ``chunk_intra_arow_kernel`` 7.6 s and
``chunk_state_kernel`` five times about 1.2 s, during measured points).

* :func:`launch_keys`: what one call launches, as hashable keys (kernel, constexprs, warps, stages);
* :func:`representative_batches`: the smallest batches of :data:`CANDIDATE_BATCHES` that, with and
  without checkpoints, reach every key any candidate reaches for the given heads, dtype and target;
* :func:`precompile_variants`: runs the chunk wrapper once per representative on scratch tensors shaped
  and typed like a served call's (its own state and checkpoint pools: the served pools are not touched).

The served KDA / GDN extend (``sglang_hybrid.layers.attention``) calls :func:`precompile_variants` on its
first chunked prefill, which the server's start-up warm-up (``--warmups sglang_hybrid``) makes before the
server reports healthy.
"""

from __future__ import annotations

import logging
import os
import time
from typing import FrozenSet, List, Optional, Sequence, Tuple

import torch

from ..plan import Target, plan_chunk

logger = logging.getLogger("sgl_hybrid_kernel.dispatch")

# Batches (tokens per sequence) whose plans span the table rules' inputs: one to 64 sequences, lengths from
# one token to 8,192, longest sequence on and off a multiple of four chunks. Ascending total tokens.
CANDIDATE_BATCHES: Tuple[Tuple[int, ...], ...] = tuple(sorted({
    *((n,) for n in (1, 16, 37, 64, 65, 256, 1000, 1024, 2048, 2100, 4096, 8192)),
    *((n,) * s for s in (2, 3, 4, 8) for n in (1, 37, 64, 256, 1024, 2048)),
    *((n,) * s for s in (16, 32, 64) for n in (1, 16, 64, 256)),
    (2048, 1500), (2048, 100, 1), (4096, 2100, 1024), (2100, 100, 1500), (8192, 1), (8192, 64, 64, 64),
    (1024,) * 12, (512,) * 24, (128,) * 48,
}, key=lambda b: (sum(b), len(b), b)))


def _name(kernel) -> str:
    return getattr(kernel, "__name__", None) or kernel.fn.__name__


def launch_keys(lens: Sequence[int], checkpoints: bool, H: int, HV: int, K: int, V: int, kind: int,
                lower_bound: Optional[float], dtype: torch.dtype, target: Target) -> FrozenSet[tuple]:
    """Keys of the binaries one chunked prefill of ``lens`` launches: ``(part, kernel name, constexprs,
    num_warps, num_stages)`` per launch of the parallel form (the state pass's group-scan launches too),
    or one ``("sequential", ...)`` key for the sequential kernel. Integer arguments are not part of a key:
    the launches' integers are strides of fixed pools and ``n_sub``, which is not specialised."""
    from .group_scan import group_scan_launch_params
    from .parallel import launch_params

    plan = plan_chunk(list(lens), HV, V, kind, lower_bound, dtype, target, checkpoints=checkpoints)
    if plan.method != "parallel":
        return frozenset({("sequential", plan.value_tile, plan.num_warps, plan.tf32)})
    lb = 0.0 if lower_bound is None else float(lower_bound)
    p = launch_params(plan.launch, kind, H, HV, K, V, lb, True, plan.tf32, checkpoints, plan.value_tile,
                      plan.num_warps, interpret=plan.interpret, state_tile=plan.state_tile,
                      lowp_scratch=plan.lowp_scratch, fuse_output=plan.fuse_output)
    parts = dict(p)
    if plan.group_chunks:
        parts.update({f"group_{k}": v for k, v in group_scan_launch_params(kind, H, HV, K, V, True, plan.tf32,
                                                                           plan.launch).items()})
    keys = set()
    for part, t in parts.items():
        kernel, cx, warps = t[0], t[1], t[2]
        stages = t[4] if len(t) > 4 else None
        keys.add((part, _name(kernel), tuple(sorted((k, repr(v)) for k, v in cx.items())), warps, stages))
    return frozenset(keys)


def representative_batches(H: int, HV: int, K: int, V: int, kind: int, lower_bound: Optional[float],
                           dtype: torch.dtype, target: Target,
                           candidates: Sequence[Sequence[int]] = CANDIDATE_BATCHES) -> List[Tuple[Tuple[int, ...], bool]]:
    """``(lens, checkpoints)`` pairs, smallest first, that together launch every key (:func:`launch_keys`)
    any candidate batch launches with or without checkpoints."""
    covered: set = set()
    out = []
    for lens in candidates:
        for ckpt in (False, True):
            keys = launch_keys(lens, ckpt, H, HV, K, V, kind, lower_bound, dtype, target)
            if keys - covered:
                covered |= keys
                out.append((tuple(lens), ckpt))
    return out


def precompile_variants(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, f: torch.Tensor, b: torch.Tensor,
                        A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, gate: str,
                        lower_bound: Optional[float] = None, state_layout: str = "vk",
                        target: Optional[Target] = None) -> Tuple[int, float]:
    """Run :func:`~sgl_hybrid_kernel.delta_rule.chunk.wrapper.gated_delta_chunk_triton` once per
    :func:`representative_batches` pair on scratch tensors with the dtypes and per-token shapes of the given
    served call (``q``, ``k`` ``[N, H, K]``; ``v`` ``[N, HV, V]``; ``f`` ``[N, HV, K]`` (KDA) or ``[N, HV]``
    (GDN); ``b`` ``[N, HV]``; ``A_log``, ``dt_bias`` as passed; ``state`` the served pool, only its slot
    shape and dtype are used). Returns (calls made, seconds; on a GPU after a synchronisation). Raises what
    the wrapper raises."""
    from ..gate import gate_kind
    from .wrapper import gated_delta_chunk_triton

    t0 = time.perf_counter()
    H, K = q.shape[1], q.shape[2]
    HV, V = v.shape[1], v.shape[2]
    kind = gate_kind(gate, lower_bound)
    tgt = target or Target.of(q.device)
    reps = representative_batches(H, HV, K, V, kind, lower_bound, q.dtype, tgt)
    dev = q.device
    gen = torch.Generator(device="cpu").manual_seed(0)

    def like(t: torch.Tensor, n: int, scale: float) -> torch.Tensor:
        x = torch.randn((n, *t.shape[1:]), generator=gen, dtype=torch.float32) * scale
        return x.to(device=dev, dtype=t.dtype)

    for lens, ckpt in reps:
        n, s = sum(lens), len(lens)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
        pool = torch.zeros((s, *state.shape[1:]), dtype=state.dtype, device=dev)
        cpool = torch.zeros((s, *state.shape[1:]), dtype=state.dtype, device=dev) if ckpt else None
        gated_delta_chunk_triton(
            like(q, n, 1.0), like(k, n, 1.0), like(v, n, 1.0), like(f, n, 0.1), like(b, n, 1.0), A_log, dt_bias, cu,
            pool, torch.arange(s, dtype=torch.int32, device=dev), torch.ones(s, dtype=torch.int32, device=dev),
            gate, lower_bound, state_layout=state_layout,
            checkpoints=[(i, n_i, i) for i, n_i in enumerate(lens)] if ckpt else (), checkpoint_pool=cpool,
            seq_lens_cpu=list(lens))
    if dev.type != "cpu":
        torch.cuda.synchronize(dev)
    return len(reps), time.perf_counter() - t0


PRECOMPILE_ENV = "SGLANG_HYBRID_PRECOMPILE_CHUNK"
_DONE: set = set()


def ensure_compiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, f: torch.Tensor, b: torch.Tensor,
                    A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, gate: str,
                    lower_bound: Optional[float] = None, state_layout: str = "vk") -> bool:
    """:func:`precompile_variants` once per process for each distinct (device, dtypes, widths, gate) of a
    served chunked prefill, logged with the count and seconds; a no-op on CPU tensors, after the first
    call of a key, or with ``SGLANG_HYBRID_PRECOMPILE_CHUNK=0``. Returns True when it compiled now."""
    # called by every served chunked prefill of every layer: the seen-key check comes first
    key = (q.device, q.dtype, k.dtype, v.dtype, f.dtype, b.dtype, A_log.dtype, dt_bias.dtype, state.dtype,
           q.shape[1:], v.shape[1:], f.shape[1:], state.shape[1:], gate, lower_bound, state_layout)
    if key in _DONE:
        return False
    _DONE.add(key)
    if q.device.type == "cpu" or os.environ.get(PRECOMPILE_ENV, "1").lower() in ("0", "false", "no"):
        return False
    n, secs = precompile_variants(q, k, v, f, b, A_log, dt_bias, state, gate, lower_bound, state_layout)
    logger.info(
        "delta_rule_prefill: %d chunk-plan binaries (%s, %d x %d heads, %s) run once on scratch tensors in %.2f s "
        "at the first prefill, so no later batch compiles one while serving (%s=0 turns this off)",
        n, gate, q.shape[1], v.shape[1], q.dtype, secs, PRECOMPILE_ENV)
    return True
