"""Single-process tests of sglang_hybrid.parallel: shard specs, DCP ownership and partial attention, MoE ownership sizes."""

from __future__ import annotations

import unittest

import torch

from sgl_hybrid_kernel.dcp import merge_partial_attention
from sgl_hybrid_kernel.mla.reference import mla_attention_absorbed
from sglang_hybrid.parallel import (
    ParallelSpec,
    dcp_owned,
    dcp_partial_attention,
    dcp_rows,
    mla_kv_bytes_per_rank,
    owned_output_rows,
    owned_weight_bytes_saved,
    shard_range,
)


class TestShardSpecs(unittest.TestCase):
    def test_shard_range_tiles_the_dimension(self):
        parts = [shard_range(12, r, 4) for r in range(4)]
        self.assertEqual([(p.start, p.stop) for p in parts], [(0, 3), (3, 6), (6, 9), (9, 12)])

    def test_bad_shapes_raise(self):
        with self.assertRaisesRegex(ValueError, "does not divide"):
            shard_range(10, 0, 4)
        with self.assertRaisesRegex(ValueError, "rank"):
            shard_range(8, 4, 4)
        with self.assertRaisesRegex(ValueError, "dcp_size"):
            ParallelSpec(tp_rank=0, tp_size=2, dcp_size=3)

    def test_dcp_rank_is_position_inside_consecutive_group(self):
        self.assertEqual([ParallelSpec(tp_rank=r, tp_size=4, dcp_size=2).dcp_rank for r in range(4)], [0, 1, 0, 1])

    def test_single_process_collectives_are_identity(self):
        x = torch.randn(3, 4)
        spec = ParallelSpec()
        self.assertIs(spec.all_reduce(x), x)
        self.assertTrue(torch.equal(spec.dcp_all_gather(x)[0], x))


class TestDcpAttention(unittest.TestCase):
    def test_owned_positions_partition_the_sequence(self):
        pos = torch.arange(23)
        masks = torch.stack([dcp_owned(pos, r, 3) for r in range(3)])
        self.assertTrue(torch.equal(masks.sum(0), torch.ones(23, dtype=torch.long)))
        self.assertEqual(pos[masks[1]].tolist(), list(range(1, 23, 3)))

    def test_widened_locations_map_to_dense_rows_of_the_position_owner(self):
        # Two requests on widened pages of 4 x 3 = 12 locations (pages 2 and 5), 17 and 9 tokens:
        # the owner of a location is the owner of its position, and each rank's rows are dense per page.
        c, wpage = 3, 12
        for base, n in ((2 * wpage, 17), (5 * wpage, 9)):
            pos = torch.arange(n)
            loc = base + pos
            rows = torch.stack([dcp_rows(loc, r, c) for r in range(c)])
            for r in range(c):
                self.assertTrue(torch.equal(rows[r] >= 0, dcp_owned(pos, r, c)))
                self.assertEqual(rows[r][rows[r] >= 0].tolist(), list(range(base // c, base // c + len(range(r, n, c)))))
        with self.assertRaisesRegex(ValueError, "rank"):
            dcp_rows(torch.arange(4), 2, 2)

    def test_sharded_attention_merged_equals_full_attention(self):
        # FP64: 3 DCP shards of a 10-token history + 4 new tokens; query at position 0..1
        # sees nothing on some shards, which must report (0, -inf).
        torch.manual_seed(0)
        S, T, H, R, P, c = 14, 14, 3, 8, 4, 3
        q_lat, q_pe = torch.randn(T, H, R, dtype=torch.float64), torch.randn(T, H, P, dtype=torch.float64)
        lat, kpe = torch.randn(S, R, dtype=torch.float64), torch.randn(S, P, dtype=torch.float64)
        ref, ref_lse = mla_attention_absorbed(q_lat, q_pe, lat, kpe, 0.3, prefix_len=S - T)
        qpos = torch.arange(S - T, S)
        outs, lses = [], []
        for r in range(c):
            keys = torch.arange(r, S, c)
            o, lse = dcp_partial_attention(q_lat, q_pe, lat[keys], kpe[keys], keys, qpos, 0.3)
            outs.append(o)
            lses.append(lse)
        self.assertTrue(torch.isneginf(lses[1][0]).all() and torch.isneginf(lses[2][0]).all())
        self.assertTrue(torch.equal(outs[2][0], torch.zeros_like(outs[2][0])))
        out, lse = merge_partial_attention(torch.stack(outs), torch.stack(lses))
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)

    def test_kv_bytes_per_rank_fall_by_dcp_width(self):
        # Kimi K3 MLA row: kv_lora_rank 512 + rope 64, BF16; 1M tokens, 8 ranks.
        one = mla_kv_bytes_per_rank(1 << 20, 576, 1, 1, 2)
        self.assertEqual(one, (1 << 20) * 576 * 2)
        self.assertEqual(mla_kv_bytes_per_rank(1 << 20, 576, 1, 8, 2) * 8, one)
        self.assertEqual(mla_kv_bytes_per_rank(9, 576, 1, 8, 2), 2 * 576 * 2)  # ceil(9 / 8) rows


class TestMoeOwnership(unittest.TestCase):
    def test_owned_rows_tile_hidden(self):
        rows = [owned_output_rows(7168, r, 8) for r in range(8)]
        self.assertEqual(sum(s.stop - s.start for s in rows), 7168)
        self.assertEqual(rows[7], slice(6272, 7168))

    def test_full_size_bytes_saved_match_article(self):
        # routed_expert_up_proj [7168, 3584] BF16 in each of 92 MoE layers, TP 8:
        # 7/8 of it per rank -> 4,136,108,032 bytes = 3.85 GiB (article, SGLang #59591).
        saved = owned_weight_bytes_saved(7168, 3584, 92, 8, 2)
        self.assertEqual(saved, 4_136_108_032)
        self.assertAlmostEqual(saved / 2**30, 3.85, places=2)
        with self.assertRaises(ValueError):
            owned_weight_bytes_saved(7168, 3584, 92, 3)


class TestHeadsTpDivide(unittest.TestCase):
    """Issue 42: a head count ``--tp`` does not divide is refused at model construction, naming the config field,
    its value and the TP width (it used to surface as a shape mismatch while loading, or ``n=3`` without a name)."""

    def test_message_names_every_field_and_the_tp_size(self):
        from sglang_hybrid.parallel.spec import check_heads_divide

        check_heads_divide(2, {"num_attention_heads": 4, "num_key_value_heads": None})
        with self.assertRaisesRegex(ValueError, r"--tp 2 does not divide Kimi K3's num_attention_heads=3, "
                                                r"linear_attn_config num_heads=5: every TP rank must hold whole heads"):
            check_heads_divide(2, {"num_attention_heads": 3, "linear_attn_config num_heads": 5, "other": 4}, "Kimi K3")

    def _kimi_config(self, **changes):
        from sglang.srt.configs.kimi_linear import KimiLinearConfig
        from tiny_model import tiny_kimi_k3

        cfg = KimiLinearConfig.from_pretrained(tiny_kimi_k3())  # 4 MLA heads, 4 KDA heads
        for k, v in changes.items():
            setattr(cfg, k, v)
        return cfg

    def test_kimi_k3_refuses_heads_tp_does_not_divide(self):
        from sglang_hybrid.models.kimi_k3 import KimiK3ReferenceForCausalLM

        # upstream's CPU TP padding: the checkpoint's 3 MLA heads became 4 before the model was built
        cfg = self._kimi_config(num_attention_heads=4, original_num_attention_heads=3)
        with self.assertRaisesRegex(ValueError, r"--tp 2 does not divide Kimi K3's num_attention_heads=3:"):
            KimiK3ReferenceForCausalLM(cfg, parallel=ParallelSpec(tp_rank=0, tp_size=2))
        cfg = self._kimi_config()
        cfg.linear_attn_config = {**cfg.linear_attn_config, "num_heads": 6}
        with self.assertRaisesRegex(ValueError, r"--tp 4 does not divide Kimi K3's linear_attn_config num_heads=6"):
            KimiK3ReferenceForCausalLM(cfg, parallel=ParallelSpec(tp_rank=1, tp_size=4))
        KimiK3ReferenceForCausalLM(self._kimi_config(), parallel=ParallelSpec(tp_rank=1, tp_size=2))  # 4 / 2: fine

    def test_qwen38_refuses_heads_tp_does_not_divide_before_loading(self):
        from unittest import mock

        from sglang.srt.configs.qwen4_exp import Qwen4ExpConfig

        from sglang_hybrid.models.qwen38.model import Qwen38ReferenceForConditionalGeneration, text_config_of
        from sglang_hybrid.parallel.qwen38_tp import shard_qwen38_text_model
        from tiny_model import tiny_qwen38

        cfg = Qwen4ExpConfig.from_pretrained(tiny_qwen38())  # 4 query heads, 1 KV head, GDN 2 key / 4 value heads
        text = text_config_of(cfg)
        text.num_attention_heads, text.original_num_attention_heads = 4, 6  # upstream's CPU TP padding of 6
        with mock.patch("sglang_hybrid.models.qwen38.model.ParallelSpec.from_sglang",
                        return_value=ParallelSpec(tp_rank=0, tp_size=4)):
            with self.assertRaisesRegex(ValueError, r"--tp 4 does not divide Qwen3.8's num_attention_heads=6, "
                                                    r"linear_num_key_heads=2: every TP rank"):
                Qwen38ReferenceForConditionalGeneration(cfg)
        text = text_config_of(Qwen4ExpConfig.from_pretrained(tiny_qwen38()))
        text.num_key_value_heads = 3  # neither 1 (replicated) nor a multiple of the TP width
        with self.assertRaisesRegex(ValueError, r"--tp 2 does not divide Qwen3.8's num_key_value_heads=3"):
            shard_qwen38_text_model(type("M", (), {"config": text, "layers": []})(), ParallelSpec(tp_rank=0, tp_size=2))


if __name__ == "__main__":
    unittest.main()
