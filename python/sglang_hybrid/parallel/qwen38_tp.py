"""Tensor parallelism for the Qwen3.8-Flash-Next reference model (issue 8).

``shard_qwen38_text_model(model, spec)`` cuts a loaded ``Qwen38TextModel`` (all
weights present) down to TP rank ``spec.tp_rank``'s part, in place, as upstream
SGLang shards its Qwen models:

=====================  =============================================================  =============
block                  this rank keeps                                                collective
=====================  =============================================================  =============
GDN                    key heads ``H_k / t`` and value heads ``H_v / t``: their rows  1 all-reduce
                       of ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` /
                       ``in_proj_a`` and of the conv, their ``A_log`` / ``dt_bias``,
                       their columns of ``out_proj`` (row-parallel); conv window and
                       recurrent state hold only those heads. ``norm`` replicated.
QSA                    query heads ``H / t`` (their ``[q | gate]`` rows, their        1 all-reduce
                       ``o_proj`` columns); KV heads split when ``t`` divides them,
                       else (``KV = 1``) the one KV head replicated; the indexer
                       (``index_qk_proj``, norms) replicated, so every rank selects
                       the same blocks.
MoE                    ``I / t`` of every expert's and the shared expert's            1 all-reduce
                       intermediate (gate/up rows, down columns); router and
                       shared-expert gate replicated; routed + gated shared partial
                       sums are reduced together.
hyper-connections,     replicated (every rank holds the same ``hc`` streams)          none
PLE, embedding, head
=====================  =============================================================  =============

Each sharded block gets a forward hook that all-reduces its output over the TP
group (``ParallelSpec.all_reduce``): the model files are not edited. Routed-
output ownership (``moe_owned_output``) applies to latent MoE only; Qwen3.8's
MoE has no replicated projection, so it raises ``ValueError`` (docs/parallelism.md).

The tiny checkpoints are loaded whole and then cut; at full size a rank would
load only its rows (``ShardSpec.ckpt_index``, as the Kimi K3 reference does).
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn

from sglang.srt.layers.radix_linear_attention import RadixLinearAttention

from sglang_hybrid.parallel.spec import ParallelSpec, check_heads_divide, shard_range

logger = logging.getLogger(__name__)


def _p(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous().clone(), requires_grad=False)


def _head_rows(heads: slice, width: int, offset: int = 0) -> torch.Tensor:
    return torch.arange(heads.start * width, heads.stop * width) + offset


def _reduce_output(module: nn.Module, spec: ParallelSpec) -> None:
    module.register_forward_hook(lambda _m, _inp, out: spec.all_reduce(out))


def shard_gdn(m, spec: ParallelSpec) -> None:
    """Cut a ``Qwen38GatedDeltaNet`` to this rank's key/value heads (module docstring).

    Raises:
        ValueError: ``tp_size`` does not divide ``H_k`` (nor, then, ``H_v``).
    """
    t, r = spec.tp_size, spec.tp_rank
    kh, vh = shard_range(m.Hk, r, t), shard_range(m.Hv, r, t)
    Kd, Vd = m.Kd, m.Vd
    q = _head_rows(kh, m.dk)
    k = _head_rows(kh, m.dk, Kd)
    v = _head_rows(vh, m.dv, 2 * Kd)
    z = _head_rows(vh, m.dv, 2 * Kd + Vd)
    b = torch.arange(vh.start, vh.stop)
    m.in_proj_qkvz = _p(m.in_proj_qkvz.data[torch.cat([q, k, v, z])])
    m.in_proj_ba = _p(m.in_proj_ba.data[torch.cat([b, b + m.Hv])])
    m.conv1d = _p(m.conv1d.data[torch.cat([q, k, v])])
    m.A_log = _p(m.A_log.data[vh])
    m.dt_bias = _p(m.dt_bias.data[vh])
    m.out_proj = _p(m.out_proj.data[:, v - 2 * Kd])
    m.Hk, m.Hv = m.Hk // t, m.Hv // t
    m.Kd, m.Vd = m.Hk * m.dk, m.Hv * m.dv
    m.attn = RadixLinearAttention(
        layer_id=m.layer_id, num_q_heads=m.Hk, num_k_heads=m.Hk, num_v_heads=m.Hv,
        head_q_dim=m.dk, head_k_dim=m.dk, head_v_dim=m.dv, conv_weights=m.conv1d, bias=None,
        activation="silu", A_log=m.A_log, dt_bias=m.dt_bias,
    )
    _reduce_output(m, spec)


def shard_qsa(m, spec: ParallelSpec) -> None:
    """Cut a ``Qwen38QSA`` to this rank's query heads; KV heads split or (``KV = 1``) replicated.

    Raises:
        ValueError: ``tp_size`` does not divide the query heads, or the KV heads
            neither split evenly nor are a single head.
    """
    t, r = spec.tp_size, spec.tp_rank
    hd, q_size, kv_size = m.hd, m.q_size, m.kv_size
    qh = shard_range(m.H, r, t)
    if m.KV % t == 0:
        kvh = shard_range(m.KV, r, t)
    elif m.KV == 1:
        kvh = slice(0, 1)
    else:
        raise ValueError(f"num_key_value_heads={m.KV} must be 1 or a multiple of tp_size={t}")
    qg = _head_rows(qh, 2 * hd)  # [q_h | gate_h] per head
    k = _head_rows(kvh, hd, 2 * q_size)
    v = _head_rows(kvh, hd, 2 * q_size + kv_size)
    m.qkv_proj = _p(m.qkv_proj.data[torch.cat([qg, k, v])])
    m.o_proj = _p(m.o_proj.data[:, _head_rows(qh, hd)])
    m.H, m.KV = m.H // t, kvh.stop - kvh.start
    m.q_size, m.kv_size = m.H * hd, m.KV * hd
    _reduce_output(m, spec)


def shard_moe(m, spec: ParallelSpec) -> None:
    """Cut a ``Qwen38MoE`` to ``I / t`` of every expert's (and the shared expert's) intermediate.

    Raises:
        ValueError: ``spec.moe_owned_output`` (no replicated projection in this
            MoE), or ``tp_size`` not dividing an intermediate size.
    """
    if spec.moe_owned_output:
        raise ValueError("moe_owned_output needs latent MoE; Qwen3.8's MoE has no replicated output projection")
    t, r = spec.tp_size, spec.tp_rank
    I = m.inter
    s = shard_range(I, r, t)
    m.w13 = _p(torch.cat([m.w13.data[:, s], m.w13.data[:, I + s.start : I + s.stop]], dim=1))
    m.w2 = _p(m.w2.data[:, :, s])
    m.inter = I // t
    shared = m.shared_expert
    if shared is not None:
        S = shared.intermediate_size
        ss = shard_range(S, r, t)
        w = shared.gate_up_proj.data
        shared.gate_up_proj = _p(torch.cat([w[ss], w[S + ss.start : S + ss.stop]]))
        shared.down_proj = _p(shared.down_proj.data[:, ss])
        shared.intermediate_size = S // t
    _reduce_output(m, spec)


# Sizes upstream's ``adjust_config_with_unaligned_cpu_tp`` pads on a CPU under --tp
# (intermediates to a multiple of 32 * tp, KV heads to tp with the query heads
# following), and the attribute where it keeps the checkpoint's own value.
_CPU_TP_PADDED = (
    ("num_attention_heads", "original_num_attention_heads"),
    ("num_key_value_heads", "original_total_num_kv_heads"),
    ("moe_intermediate_size", "original_moe_intermediate_size"),
    ("shared_expert_intermediate_size", "original_shared_expert_intermediate_size"),
    ("intermediate_size", "original_intermediate_size"),
)


def checkpoint_sized_config(text_config):
    """``text_config`` with the checkpoint's own head counts and intermediate sizes.

    On ``--device cpu`` upstream's model runner pads, before building the model,
    the MoE / shared-expert intermediate sizes to a multiple of ``32 * tp`` and
    the KV heads to ``tp`` (query heads scaled along), keeping the originals as
    ``original_*`` attributes; its fused CPU kernels need the alignment, and its
    weight loaders zero-fill the padding. The reference model runs the
    checkpoint's shapes and handles a single KV head by replication
    (``shard_qsa``), so it is built from the originals. Returns ``text_config``
    itself when nothing was padded, else a shallow copy (the config upstream
    keeps, which sizes the KV pool, is not changed).
    """
    restore = {}
    for attr, original in _CPU_TP_PADDED:
        value = getattr(text_config, original, None)
        if value is not None and getattr(text_config, attr, None) != value:
            restore[attr] = value
    if not restore:
        return text_config
    cfg = copy.copy(text_config)
    for attr, value in restore.items():
        setattr(cfg, attr, value)
    return cfg


def check_qwen38_heads(text_config, tp_size: int) -> None:
    """Refuse at start-up (before any weight is loaded) the head counts ``--tp`` cannot cut: GDN key and
    value heads, QSA query heads, QSA KV heads unless a single one (replicated, :func:`shard_qsa`).
    ``text_config``: the checkpoint-sized text config (:func:`checkpoint_sized_config`).

    Raises:
        ValueError: naming the config field, its value and the TP width (``spec.check_heads_divide``).
    """
    heads = {f: getattr(text_config, f, None) for f in ("num_attention_heads", "linear_num_key_heads",
                                                       "linear_num_value_heads")}
    kv = getattr(text_config, "num_key_value_heads", None)
    if kv != 1:
        heads["num_key_value_heads"] = kv
    check_heads_divide(tp_size, heads, "Qwen3.8")


def shard_qwen38_text_model(model, spec: ParallelSpec):
    """Cut every GDN / QSA / MoE block of a loaded ``Qwen38TextModel`` to rank ``spec.tp_rank`` (in place).

    Returns ``model``; ``model.parallel`` is set to ``spec``. A ``spec`` of
    width 1 leaves the model unchanged.

    Raises:
        ValueError: ``spec.dcp_size > 1`` (DCP is for MLA; Qwen3.8 has none), a head count the TP
            width does not divide (:func:`check_qwen38_heads`, naming the config field), or an
            intermediate size it does not divide (see the block functions).
    """
    if spec.dcp_size != 1:
        raise ValueError("dcp_size must be 1: decode context parallel applies to MLA (Kimi K3), not QSA")
    check_qwen38_heads(model.config, spec.tp_size)
    model.parallel = spec
    if spec.tp_size == 1:
        if spec.moe_owned_output:
            raise ValueError("moe_owned_output needs latent MoE; Qwen3.8's MoE has no replicated output projection")
        return model
    for layer in model.layers:
        if layer.is_linear:
            shard_gdn(layer.linear_attn, spec)
        else:
            shard_qsa(layer.self_attn, spec)
        shard_moe(layer.mlp, spec)
    gdn = next((layer.linear_attn for layer in model.layers if layer.is_linear), None)
    qsa = next((layer.self_attn for layer in model.layers if not layer.is_linear), None)
    logger.info(
        "qwen3.8 TP rank %d/%d: GDN key/value heads %s/%s, QSA query/KV heads %s/%s, MoE intermediate %d per rank",
        spec.tp_rank, spec.tp_size, gdn and gdn.Hk, gdn and gdn.Hv, qsa and qsa.H, qsa and qsa.KV,
        model.layers[0].mlp.inter,
    )
    return model
