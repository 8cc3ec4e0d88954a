"""An independent FP64 oracle of the Qwen3.8-Flash-Next architecture for one sequence.

Written separately from ``sglang_hybrid.models.qwen38`` so a shared mistake
cannot hide: it reads ``config.json`` and ``model.safetensors`` directly and
recomputes the whole sequence from scratch (no cache, no pools), with explicit
per-token loops: the GDN recurrence token by token, the n-gram hashes in Python
integers, the QSA block choice by sorting Python lists per query, the PLE
dilated convolution tap by tap, MoE routing per token. Follows upstream SGLang
0.5.23 ``models/qwen4_exp.py`` / ``qwen4_exp_mtp.py`` semantics; cross-checked
against Hugging Face transformers' own ``Qwen4ExpForCausalLM`` in
``test_qwen38_oracle.py``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict, List

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

DT = torch.float64
M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def _primes_from(start: int, count: int) -> List[int]:
    out, p = [], start
    while len(out) < count:
        if p > 1 and all(p % d for d in range(2, int(p ** 0.5) + 1)):
            out.append(p)
        p += 1
    return out


class Qwen38Oracle:
    def __init__(self, model_dir: str):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.c = json.load(f)["text_config"]
        raw = load_file(os.path.join(model_dir, "model.safetensors"))
        self.W: Dict[str, torch.Tensor] = {}
        for k, v in raw.items():
            k = k.replace("model.language_model.", "model.")
            if ".ngram_embedding.shard_" in k:
                continue
            self.W[k] = v.to(DT)
        # n-gram tables: shards concatenated in order
        for k in sorted({k.split(".ple_embedding.")[0] for k in raw if ".ngram_embedding.shard_" in k}):
            n = len([s for s in raw if s.startswith(k + ".ple_embedding.ngram_embedding.shard_")])
            parts = [raw[f"{k}.ple_embedding.ngram_embedding.shard_{i}.weight"] for i in range(n)]
            self.W[k.replace("model.language_model.", "model.") + ".table"] = torch.cat(parts).to(DT)
        self.eps = self.c["rms_norm_eps"]
        self.D, self.hc = self.c["hidden_size"], self.c["hc_count"]

    # ---------------------------------------------------------------- norms
    def _rms(self, x, w, group=None, gemma=True):
        g = group or x.shape[-1]
        y = x.reshape(*x.shape[:-1], -1, g)
        y = (y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).reshape(x.shape)
        return y * ((1.0 + w) if gemma else w)

    def _rope(self, x, pos):
        """x [..., d] at integer position pos (a list/tensor broadcast over the first dim)."""
        c = self.c
        rope = c.get("rope_parameters") or {}
        theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
        rd = int(c["head_dim"] * rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
        half = rd // 2
        freq = torch.tensor([theta ** (-2.0 * i / rd) for i in range(half)], dtype=DT)
        ang = torch.as_tensor(pos, dtype=DT).reshape(-1, *([1] * (x.dim() - 1))) * freq
        a, b = x[..., :half], x[..., half:rd]
        return torch.cat([a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin(), x[..., rd:]], -1)

    # ---------------------------------------------------------------- residual streams
    def _read(self, p, S):
        xn = self._rms(S, self.W[f"{p}.hc_norm.weight"], group=self.D)
        h = F.silu(xn @ self.W[f"{p}.input_mix_weight_down.weight"].T / self.hc)
        gates = torch.sigmoid(h @ self.W[f"{p}.input_mix_weight_up.weight"].T)
        return (gates * xn).view(-1, self.hc, self.D).mean(1), xn

    def _write(self, p, out, S, xn):
        inj = 2 * torch.sigmoid(xn @ self.W[f"{p}.block_inject_weight.weight"].T / self.hc)
        return (S.view(-1, self.hc, self.D) + inj.unsqueeze(-1) * out.unsqueeze(1)).reshape(S.shape)

    # ---------------------------------------------------------------- PLE
    def _ngram_rows(self, tokens: List[int], ple_index: int) -> List[List[int]]:
        c = self.c
        n, hpn = c["ngram_size"], c["heads_per_ngram"]
        heads = (n - 1) * hpn
        eos = c["eos_token_id"]
        V = c["vocab_size"]
        half = max(1, ((1 << 63) - 1) // V // 2)
        seed = c.get("seed", 1234) + 10007 * ple_index
        mult = [2 * (_mix64((seed + 0x9E3779B97F4A7C15 * (i + 1)) & M64) % half) + 1 for i in range(n)]
        sizes = _primes_from(c["ngram_vocab_size_base"], (ple_index + 1) * heads)[ple_index * heads :]
        offs = [sum(sizes[:h]) for h in range(heads)]
        rows = []
        for t in range(len(tokens)):
            # token t-s counts only if it exists and none of tokens t-s .. t-1 is an EOS
            prev = [
                tokens[t - s] if t - s >= 0 and all(tokens[j] != eos for j in range(t - s, t)) else eos
                for s in range(n)
            ]
            row = []
            for k in range(2, n + 1):
                mix = 0
                for s in range(k):
                    mix ^= prev[s] * mult[s]
                for h in range((k - 2) * hpn, (k - 1) * hpn):
                    row.append(mix % sizes[h] + offs[h])
            rows.append(row)
        return rows

    def _ple(self, p, S, tokens, ple_index):
        c = self.c
        D, hc = self.D, self.hc
        table = self.W[f"{p}.table"]
        E = torch.stack([table[torch.tensor(r)].reshape(-1) for r in self._ngram_rows(tokens, ple_index)])
        key = self._rms(E @ self.W[f"{p}.key_proj.weight"].T, self.W[f"{p}.norm_key.weight"], group=D).view(-1, hc, D)
        query = self._rms(S, self.W[f"{p}.norm_query.weight"], group=D).view(-1, hc, D)
        value = E @ self.W[f"{p}.value_proj.weight"].T
        g = (key * query).sum(-1) / math.sqrt(D)
        gate = torch.sigmoid(torch.sign(g) * torch.sqrt(g.abs().clamp_min(1e-6)))
        v = (gate.unsqueeze(-1) * value.unsqueeze(1)).reshape(-1, hc * D)
        vn = self._rms(v, self.W[f"{p}.norm_conv.weight"], group=D)
        w = self.W[f"{p}.conv1d.weight"][:, 0]  # [C, K]
        K, dil = w.shape[1], c["ngram_size"]
        T = vn.shape[0]
        y = torch.zeros_like(vn)
        for j in range(K):  # tap j reads the input (K - 1 - j) * dilation tokens back
            lag = (K - 1 - j) * dil
            if lag < T:
                y[lag:] += w[:, j] * vn[: T - lag]
        return v + F.silu(y)

    # ---------------------------------------------------------------- GDN
    def _gdn(self, p, x):
        c = self.c
        T = x.shape[0]
        Hk, Hv, dk, dv = c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
        qkv = x @ self.W[f"{p}.in_proj_qkv.weight"].T
        w = self.W[f"{p}.conv1d.weight"][:, 0]  # [C, K], tap K-1 multiplies the current token
        K = w.shape[1]
        qkv = F.silu(sum(w[:, j] * F.pad(qkv, (0, 0, K - 1 - j, 0))[:T] for j in range(K)))
        q, k, v = qkv.split([Hk * dk, Hk * dk, Hv * dv], -1)
        q, k, v = q.reshape(T, Hk, dk), k.reshape(T, Hk, dk), v.reshape(T, Hv, dv)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        z = (x @ self.W[f"{p}.in_proj_z.weight"].T).reshape(T, Hv, dv)
        beta = torch.sigmoid(x @ self.W[f"{p}.in_proj_b.weight"].T)
        a = x @ self.W[f"{p}.in_proj_a.weight"].T
        g = -torch.exp(self.W[f"{p}.A_log"]) * F.softplus(a + self.W[f"{p}.dt_bias"])
        rep = Hv // Hk
        o = torch.zeros(T, Hv, dv, dtype=DT)
        for h in range(Hv):
            S = torch.zeros(dk, dv, dtype=DT)
            qh, kh = q[:, h // rep], k[:, h // rep]
            for t in range(T):
                S = S * torch.exp(g[t, h])
                S = S + beta[t, h] * torch.outer(kh[t], v[t, h] - kh[t] @ S)
                o[t, h] = (qh[t] * dk ** -0.5) @ S
        act = c.get("output_gate_type") or c["hidden_act"]
        gate = F.silu(z) if act == "silu" else torch.sigmoid(z)
        o = self._rms(o, self.W[f"{p}.norm.weight"], gemma=False) * gate
        return o.reshape(T, Hv * dv) @ self.W[f"{p}.out_proj.weight"].T

    # ---------------------------------------------------------------- QSA
    def _qsa(self, p, x):
        c = self.c
        T = x.shape[0]
        H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        n, idim, r = c["indexer_n_heads"], c["indexer_head_dim"], c["indexer_compress_ratio"]
        topk = c["indexer_budget"] // r
        pos = list(range(T))
        qg = (x @ self.W[f"{p}.q_proj.weight"].T).view(T, H, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(T, H * hd)
        q = self._rope(self._rms(q, self.W[f"{p}.q_norm.weight"]), pos)
        k = self._rope(self._rms((x @ self.W[f"{p}.k_proj.weight"].T).view(T, KV, hd), self.W[f"{p}.k_norm.weight"]), pos)
        v = (x @ self.W[f"{p}.v_proj.weight"].T).view(T, KV, hd)
        iqk = x @ self.W[f"{p}.indexer.index_qk_proj.weight"].T
        iq = self._rope(self._rms(iqk[:, : n * idim].view(T, n, idim), self.W[f"{p}.indexer.q_layernorm.weight"]), pos)
        ik = iqk[:, n * idim :]
        nb = T // r
        blocks = torch.stack([ik[b * r : (b + 1) * r].mean(0) for b in range(nb)]) if nb else ik[:0]
        blocks = self._rope(self._rms(blocks, self.W[f"{p}.indexer.k_layernorm.weight"]), [b * r for b in range(nb)])
        out = torch.zeros(T, H, hd, dtype=DT)
        kv_of_head = [h // (H // KV) for h in range(H)]
        for t in range(T):
            vis = (t + 1) // r
            if vis <= topk:
                chosen = list(range(vis))
            else:
                sc = (torch.relu(blocks[:vis] @ iq[t].T).sum(-1) / math.sqrt(idim)).tolist()
                chosen = sorted(range(vis), key=lambda b: (-sc[b], b))[:topk]
            sel = torch.tensor(sorted([b * r + j for b in chosen for j in range(r)] + list(range(vis * r, t + 1))))
            ks, vs = k[sel][:, kv_of_head], v[sel][:, kv_of_head]  # [L, H, hd]
            p_ = (torch.einsum("lhd,hd->hl", ks, q[t]) / math.sqrt(hd)).softmax(-1)
            out[t] = torch.einsum("hl,lhd->hd", p_, vs)
        return (out.reshape(T, H * hd) * torch.sigmoid(gate)) @ self.W[f"{p}.o_proj.weight"].T

    # ---------------------------------------------------------------- MoE
    def _moe(self, p, x):
        c = self.c
        k = c["num_experts_per_tok"]
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            probs = torch.softmax(self.W[f"{p}.gate.weight"] @ x[t], 0).tolist()
            chosen = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[:k]
            total = sum(probs[e] for e in chosen) if c.get("norm_topk_prob", True) else 1.0
            for e in chosen:
                ex = f"{p}.experts.{e}"
                hdn = F.silu(self.W[f"{ex}.gate_proj.weight"] @ x[t]) * (self.W[f"{ex}.up_proj.weight"] @ x[t])
                out[t] += probs[e] / total * (self.W[f"{ex}.down_proj.weight"] @ hdn)
        s = f"{p}.shared_expert"
        shared = (F.silu(x @ self.W[f"{s}.gate_proj.weight"].T) * (x @ self.W[f"{s}.up_proj.weight"].T)) @ self.W[f"{s}.down_proj.weight"].T
        return out + torch.sigmoid(x @ self.W[f"{p}.shared_expert_gate.weight"].T) * shared

    # ---------------------------------------------------------------- model
    def _layer(self, p, S, tokens, attention_kind, ple_index=None):
        if ple_index is not None:
            S = S + self._ple(f"{p}.ple", S, tokens, ple_index)
        x, xn = self._read(f"{p}.attn_hyper_connection", S)
        a = self._gdn(f"{p}.linear_attn", x) if attention_kind == "linear_attention" else self._qsa(f"{p}.self_attn", x)
        S = self._write(f"{p}.attn_hyper_connection", a, S, xn)
        x, xn = self._read(f"{p}.mlp_hyper_connection", S)
        return self._write(f"{p}.mlp_hyper_connection", self._moe(f"{p}.mlp", x), S, xn)

    def streams(self, token_ids: List[int]) -> torch.Tensor:
        """The residual streams after the last layer, ``[T, hc * D]`` (what MTP drafts from)."""
        c = self.c
        ple = sorted(set(c.get("ple_layer_ids") or []))
        S = self.W["model.embed_tokens.weight"][torch.tensor(token_ids)].repeat(1, self.hc)
        for i, kind in enumerate(c["layer_types"]):
            S = self._layer(f"model.layers.{i}", S, token_ids, kind, ple.index(i + 1) if (i + 1) in ple else None)
        return S

    def logits(self, token_ids: List[int]) -> torch.Tensor:
        """Next-token logits ``[T, vocab]`` (FP64) for every prefix of ``token_ids``."""
        h, _ = self._read("model.hyper_connection_mixer", self.streams(token_ids))
        return h @ self.W["lm_head.weight"].T

    def mtp_logits(self, token_ids: List[int]) -> torch.Tensor:
        """MTP draft logits ``[T - 1, vocab]``: row ``t`` predicts token ``t + 2`` from the
        target's streams at ``t`` and the embedding of token ``t + 1``."""
        S = self.streams(token_ids)[:-1]
        e = self.W["model.embed_tokens.weight"][torch.tensor(token_ids[1:])]
        e = self._rms(e, self.W["mtp.pre_fc_norm_embedding.weight"]) @ self.W["mtp.fc_embedding.weight"].T
        hid = self._rms(S, self.W["mtp.pre_fc_norm_hidden.weight"]).view(-1, self.hc, self.D) @ self.W["mtp.fc_hidden.weight"].T
        S = (e.unsqueeze(1) + hid).reshape(-1, self.hc * self.D)
        S = self._layer("mtp.layers.0", S, token_ids[1:], "full_attention")
        h, _ = self._read("mtp.hyper_connection_mixer", S)
        return h @ self.W["lm_head.weight"].T

    def greedy(self, prompt: List[int], n: int) -> List[int]:
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(self.logits(ids)[-1].argmax()))
        return ids[len(prompt) :]
