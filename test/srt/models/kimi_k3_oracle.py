"""An independent FP64 oracle of the Kimi K3 architecture for one sequence.

Written separately from ``sglang_hybrid.models.kimi_k3`` so a shared mistake
cannot hide: it reads ``config.json`` and ``model.safetensors`` directly, uses
the *non-absorbed* MLA form (keys and values up-projected per head), fla-core's
naive KDA gate and recurrence (an outside reference), a per-token loop for MoE
routing, and recomputes the whole sequence from scratch (no cache, no state
pool). Follows upstream SGLang 0.5.23 ``models/kimi_k3.py`` semantics.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List

import torch
import torch.nn.functional as F
from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate
from fla.ops.kda.naive import naive_recurrent_kda
from safetensors.torch import load_file

DT = torch.float64


class KimiK3Oracle:
    def __init__(self, model_dir: str):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.W: Dict[str, torch.Tensor] = {
            k: v.to(DT) for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()
        }
        self.eps = self.cfg["rms_norm_eps"]

    # ---------------------------------------------------------------- pieces
    @staticmethod
    def _rms(x, w, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def _mla(self, p, x):
        c = self.cfg
        T = x.shape[0]
        H, dn, dr, dv, R = (
            c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"],
        )
        q = (x @ self.W[f"{p}.q_proj.weight"].T).view(T, H, dn + dr)
        kv = x @ self.W[f"{p}.kv_a_proj_with_mqa.weight"].T
        lat = self._rms(kv[:, :R], self.W[f"{p}.kv_a_layernorm.weight"], self.eps)
        k_pe = kv[:, R:]
        kvb = (lat @ self.W[f"{p}.kv_b_proj.weight"].T).view(T, H, dn + dv)
        k = torch.cat([kvb[..., :dn], k_pe.unsqueeze(1).expand(T, H, dr)], dim=-1)
        v = kvb[..., dn:]
        s = torch.einsum("thd,shd->hts", q, k) * (dn + dr) ** -0.5
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, H * dv)
        if c.get("mla_use_output_gate"):
            o = o * torch.sigmoid(x @ self.W[f"{p}.g_proj.weight"].T)
        return o @ self.W[f"{p}.o_proj.weight"].T

    def _kda(self, p, x):
        la = self.cfg["linear_attn_config"]
        T = x.shape[0]
        H, K = la["num_heads"], la["head_dim"]

        def conv(name, y):
            w = self.W[f"{p}.{name}.weight"]  # [P, 1, C]
            return F.silu(F.conv1d(y.T.unsqueeze(0), w, padding=w.shape[-1] - 1, groups=w.shape[0])[0, :, :T].T)

        q = conv("q_conv1d", x @ self.W[f"{p}.q_proj.weight"].T).view(T, H, K)
        k = conv("k_conv1d", x @ self.W[f"{p}.k_proj.weight"].T).view(T, H, K)
        v = conv("v_conv1d", x @ self.W[f"{p}.v_proj.weight"].T).view(T, H, K)
        q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        f = (x @ self.W[f"{p}.f_a_proj.weight"].T) @ self.W[f"{p}.f_b_proj.weight"].T
        A_log, dt_bias = self.W[f"{p}.A_log"], self.W[f"{p}.dt_bias"]
        lb = la.get("gate_lower_bound")
        f = f.view(T, H, K)
        if lb is None:
            g = naive_kda_gate(f, A_log, dt_bias, output_dtype=DT)
        else:
            g = naive_kda_lowerbound_gate(f, A_log, dt_bias, lower_bound=lb, output_dtype=DT)
        beta = torch.sigmoid(x @ self.W[f"{p}.b_proj.weight"].T)
        o, _ = naive_recurrent_kda(q[None], k[None], v[None], g[None], beta[None])
        o = o[0]
        gate = (x @ self.W[f"{p}.g_proj.weight"].T).view(T, H, K)
        o = self._rms(o, self.W[f"{p}.o_norm.weight"], 1e-5) * torch.sigmoid(gate)
        return o.reshape(T, H * K) @ self.W[f"{p}.o_proj.weight"].T

    def _swiglu(self, p, x, a="gate_proj", b="up_proj", c="down_proj"):
        return (F.silu(x @ self.W[f"{p}.{a}.weight"].T) * (x @ self.W[f"{p}.{b}.weight"].T)) @ self.W[f"{p}.{c}.weight"].T

    def _moe(self, p, x):
        c = self.cfg
        E, k = c["num_experts"], c["num_experts_per_token"]
        G, tg = c["num_expert_group"], c["topk_group"]
        bias = self.W[f"{p}.gate.e_score_correction_bias"]
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            scores = torch.sigmoid(x[t] @ self.W[f"{p}.gate.weight"].T)
            choice = (scores + bias).tolist()
            per = E // G
            group_score = [sum(sorted(choice[g * per : (g + 1) * per], reverse=True)[:2]) for g in range(G)]
            groups = sorted(range(G), key=lambda g: (-group_score[g], g))[:tg]
            allowed = [e for e in range(E) if e // per in groups]
            chosen = sorted(allowed, key=lambda e: (-choice[e], e))[:k]
            w = scores[chosen]
            if c["moe_renormalize"]:
                w = w / w.sum()
            w = w * c["routed_scaling_factor"]
            for wi, e in zip(w, chosen):
                out[t] += wi * self._swiglu(f"{p}.experts.{e}", x[t : t + 1], "w1", "w3", "w2")[0]
        if c["num_shared_experts"]:
            out = out + self._swiglu(f"{p}.shared_experts", x)
        return out

    # ---------------------------------------------------------------- model
    def logits(self, token_ids: List[int]) -> torch.Tensor:
        """Next-token logits ``[T, vocab]`` (FP64) for every prefix of ``token_ids``."""
        c = self.cfg
        la = c["linear_attn_config"]
        L, B = c["num_hidden_layers"], c["attn_res_block_size"]
        x0 = self.W["model.embed_tokens.weight"][torch.tensor(token_ids)]
        bank: List[torch.Tensor] = []
        partial = None

        def read(contribution, norm_name, score_prefix, write):
            nonlocal partial
            head = contribution if partial is None else partial + contribution
            rows = torch.stack(bank + [head], dim=1)  # [T, R, D]
            s = self._rms(rows, self.W[f"{score_prefix}_norm.weight"], self.eps) @ self.W[f"{score_prefix}_proj.weight"][0]
            mixed = (s.softmax(-1).unsqueeze(-1) * rows).sum(1)
            if write:
                bank.append(head)
                partial = None
            else:
                partial = head
            return self._rms(mixed, self.W[norm_name], self.eps)

        contribution = x0
        for i in range(L):
            p = f"model.layers.{i}"
            x = read(contribution, f"{p}.input_layernorm.weight", f"{p}.self_attention_res", write=(i % B == 0))
            a = self._kda(f"{p}.self_attn", x) if (i + 1) in la["kda_layers"] else self._mla(f"{p}.self_attn", x)
            x = read(a, f"{p}.post_attention_layernorm.weight", f"{p}.mlp_res", write=False)
            moe = i >= c["first_k_dense_replace"] and i % c["moe_layer_freq"] == 0
            contribution = self._moe(f"{p}.mlp", x) if moe else self._swiglu(f"{p}.mlp", x)
        h = read(contribution, "model.norm.weight", "model.output_attn_res", write=False)
        return h @ self.W["lm_head.weight"].T

    def greedy(self, prompt: List[int], n: int) -> List[int]:
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(self.logits(ids)[-1].argmax()))
        return ids[len(prompt) :]
