"""Per-layer n-gram embeddings (PLE) of Qwen3.8-Flash-Next (upstream ``Qwen4ExpPLELayer``).

A PLE layer adds its own contribution to the residual streams before the
layer's attention read. For token ``t``:

1. **Hash.** For each order ``k = 2..ngram_size``: ``mix = XOR_{s<k} tok_{t-s} * m_s``
   (``m_s`` odd 64-bit multipliers from splitmix64 of ``seed + 10007 * ple_layer_index``),
   then one id per head ``h`` of that order: ``mix mod p_h + offset_h``, ``p_h``
   the ``(g+1)``-th prime >= ``ngram_vocab_size_base`` for the global head index
   ``g``. A token before the most recent EOS (or before the sequence start) counts
   as EOS, so n-grams never cross a document boundary.
2. **Embed.** Concatenate the heads' table rows -> ``e`` ``[E]``.
3. **Gate.** ``key = norm_key(W_k e)`` ``[hc, D]``, ``value = W_v e`` ``[D]``,
   ``query = norm_query(streams)`` ``[hc, D]`` (per-stream RMSNorm, ``1 + w``);
   ``g = <key, query> / sqrt(D)``, ``gate = sigmoid(sign(g) sqrt(max(|g|, 1e-6)))``;
   ``v_j = gate_j * value``.
4. **Short conv.** ``out = v + silu(conv(norm_conv(v)))``, a depthwise causal
   convolution of ``ple_conv_kernel_size`` taps with dilation ``ngram_size`` over
   the request's tokens (state: the last ``(K-1) * ngram_size`` inputs).

State per request (upstream's PLE side pools, addressed by the request's mamba
slot so the radix cache checkpoints them with the recurrent state): the last
``ngram_size - 1`` token ids and the short-conv window ``[hc * D, (K-1) * ngram_size]``.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sglang_hybrid.models.kimi_k3.weights import ShardSpec
from sglang_hybrid.models.qwen38.hyper import _param, grouped_rms_norm

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_LAYER_SEED_STRIDE = 10007


def _splitmix64(x: int) -> int:
    x = (x + _GAMMA) & _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return (x ^ (x >> 31)) & _MASK64


def ngram_multipliers(vocab_size: int, ngram_size: int, ple_layer_index: int, seed: int = 1234) -> List[int]:
    """The ``ngram_size`` odd hash multipliers of one PLE layer.

    Each is below ``(2**63 - 1) // vocab_size``, so ``token * multiplier`` never
    overflows int64.
    """
    half = max(1, ((1 << 63) - 1) // max(vocab_size, 1) // 2)
    base = seed + _LAYER_SEED_STRIDE * ple_layer_index
    return [2 * (_splitmix64((base + _GAMMA * (i + 1)) & _MASK64) % half) + 1 for i in range(ngram_size)]


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % f for f in range(2, math.isqrt(n) + 1))


def ngram_head_sizes(base: int, heads: int, ple_layer_index: int) -> List[int]:
    """Hash-table size per head of one PLE layer: consecutive primes >= ``base``,
    ``heads`` of them per layer, layer ``j`` taking primes ``j*heads .. (j+1)*heads - 1``."""
    sizes, p = [], base - 1
    while len(sizes) < (ple_layer_index + 1) * heads:
        p += 1
        while not _is_prime(p):
            p += 1
        sizes.append(p)
    return sizes[ple_layer_index * heads :]


def ngram_ids(
    windows: torch.Tensor,
    multipliers: List[int],
    head_sizes: List[int],
    heads_per_ngram: int,
    eos_token_id: int,
) -> torch.Tensor:
    """Hashed n-gram row ids for each token.

    Args:
        windows: ``[N, n]`` int64, row ``i`` = the ``n = ngram_size`` token ids
            ending at token ``i`` (oldest first; positions before the sequence
            start hold ``eos_token_id``).
        multipliers: ``n`` ints (:func:`ngram_multipliers`).
        head_sizes: ``(n - 1) * heads_per_ngram`` primes (:func:`ngram_head_sizes`).
        heads_per_ngram: heads per n-gram order.
        eos_token_id: the document separator.

    Returns:
        ``[N, (n - 1) * heads_per_ngram]`` int64 rows of the layer's table.

    Raises:
        ValueError: inconsistent sizes.
    """
    N, n = windows.shape
    if len(multipliers) != n or len(head_sizes) != (n - 1) * heads_per_ngram:
        raise ValueError(f"need {n} multipliers and {(n - 1) * heads_per_ngram} head sizes")
    windows = windows.long()
    is_eos = windows == eos_token_id
    shifted = []
    for s in range(n):
        tok = windows[:, n - 1 - s]
        # tok_{t-s} counts only if none of tok_{t-s} .. tok_{t-1} is an EOS.
        crosses = is_eos[:, n - 1 - s : n - 1].any(dim=1) if s else torch.zeros(N, dtype=torch.bool)
        shifted.append(torch.where(crosses, torch.full_like(tok, eos_token_id), tok))
    offsets = [0]
    for size in head_sizes[:-1]:
        offsets.append(offsets[-1] + size)
    sizes_t, offsets_t = torch.tensor(head_sizes), torch.tensor(offsets)
    blocks = []
    for k in range(2, n + 1):
        mix = shifted[0] * multipliers[0]
        for s in range(1, k):
            mix = torch.bitwise_xor(mix, shifted[s] * multipliers[s])
        sl = slice((k - 2) * heads_per_ngram, (k - 1) * heads_per_ngram)
        blocks.append(torch.remainder(mix.unsqueeze(-1), sizes_t[sl]) + offsets_t[sl])
    return torch.cat(blocks, dim=-1)


def dilated_causal_conv(
    x: torch.Tensor, weight: torch.Tensor, dilation: int, state: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution with dilation over one sequence.

    Args:
        x: ``[T, C]`` new inputs.
        weight: ``[C, K]`` taps, oldest first.
        dilation: step between taps, in tokens.
        state: ``[S, C]`` previous inputs, ``S = (K - 1) * dilation`` (``None`` = zeros).

    Returns:
        ``(y [T, C] before the activation, xx [S + T, C] = cat(state, x))``; the
        state after ``j`` new tokens is ``xx[j : j + S]``.
    """
    T, C = x.shape
    K = weight.shape[1]
    S = (K - 1) * dilation
    if state is None:
        state = x.new_zeros(S, C)
    elif tuple(state.shape) != (S, C):
        raise ValueError(f"state must be [{S}, {C}], got {tuple(state.shape)}")
    xx = torch.cat([state.to(x.dtype), x], dim=0)
    y = F.conv1d(xx.t().unsqueeze(0), weight.unsqueeze(1), groups=C, dilation=dilation)[0].t()
    return y, xx


class PLELayer(nn.Module):
    """One PLE layer (module docstring). ``ple_layer_index``: its rank among the PLE layers."""

    def __init__(self, config, ple_layer_index: int):
        super().__init__()
        self.hc, self.D = config.hc_count, config.hidden_size
        self.eps = config.rms_norm_eps
        self.ngram_size = int(config.ngram_size)
        self.heads_per_ngram = int(config.heads_per_ngram)
        self.heads = (self.ngram_size - 1) * self.heads_per_ngram
        E = int(config.ple_embed_dim or config.hidden_size)
        if E % self.heads:
            raise ValueError(f"ple_embed_dim={E} must be divisible by the {self.heads} n-gram heads")
        self.eos = int(config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id)
        self.multipliers = ngram_multipliers(config.vocab_size, self.ngram_size, ple_layer_index, int(getattr(config, "seed", 1234)))
        self.head_sizes = ngram_head_sizes(int(config.ngram_vocab_size_base), self.heads, ple_layer_index)
        div = int(config.make_ngram_vocab_size_divisible_by)
        self.table_rows = -(-sum(self.head_sizes) // div) * div
        self.shard_parts = int(getattr(config, "split_ngram_parts", 512))
        self.kernel = int(config.ple_conv_kernel_size)
        self.state_len = (self.kernel - 1) * self.ngram_size
        W = self.hc * self.D
        self.ngram_embedding = _param(self.table_rows, E // self.heads)
        self.key_proj = _param(W, E)
        self.value_proj = _param(self.D, E)
        self.norm_key = _param(W)
        self.norm_query = _param(W)
        self.norm_conv = _param(W)
        self.conv1d = _param(W, self.kernel)

    def checkpoint_mapping(self, ckpt: str, me: str) -> Dict[str, ShardSpec]:
        m = {}
        shard = -(-self.table_rows // self.shard_parts)
        for k in range(self.shard_parts):
            rows = min(shard, self.table_rows - k * shard)
            if rows > 0:
                m[f"{ckpt}.ple_embedding.ngram_embedding.shard_{k}.weight"] = ShardSpec(
                    f"{me}.ngram_embedding", (slice(k * shard, k * shard + rows),)
                )
        for n in ("key_proj", "value_proj", "norm_key", "norm_query", "norm_conv"):
            m[f"{ckpt}.{n}.weight"] = ShardSpec(f"{me}.{n}")
        m[f"{ckpt}.conv1d.weight"] = ShardSpec(f"{me}.conv1d", (slice(None), None))
        return m

    def embed(self, windows: torch.Tensor) -> torch.Tensor:
        """``windows`` ``[N, ngram_size]`` -> concatenated head embeddings ``[N, E]``."""
        ids = ngram_ids(windows, self.multipliers, self.head_sizes, self.heads_per_ngram, self.eos)
        return self.ngram_embedding[ids].flatten(-2)

    def gated_values(self, streams: torch.Tensor, windows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Steps 1-3: ``(v [N, hc*D], norm_conv(v) [N, hc*D])`` for ``streams`` ``[N, hc*D]``."""
        e = self.embed(windows).to(streams.dtype)
        key = grouped_rms_norm(e @ self.key_proj.t(), self.norm_key, self.D, self.eps).unflatten(-1, (self.hc, self.D))
        query = grouped_rms_norm(streams, self.norm_query, self.D, self.eps).unflatten(-1, (self.hc, self.D))
        value = e @ self.value_proj.t()
        g = (key * query).sum(-1, keepdim=True) / math.sqrt(self.D)
        gate = torch.sigmoid(g.abs().clamp_min(1e-6).sqrt() * g.sign())
        v = (gate * value.unsqueeze(-2)).flatten(-2)
        return v, grouped_rms_norm(v, self.norm_conv, self.D, self.eps)

    def forward_sequence(
        self, streams: torch.Tensor, windows: torch.Tensor, conv_state: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """PLE output for one request's new tokens: ``(out [T, hc*D], xx)`` with
        ``xx = cat(conv_state, conv inputs)`` (:func:`dilated_causal_conv`)."""
        v, vn = self.gated_values(streams, windows)
        y, xx = dilated_causal_conv(vn, self.conv1d, self.ngram_size, conv_state)
        return v + F.silu(y), xx
