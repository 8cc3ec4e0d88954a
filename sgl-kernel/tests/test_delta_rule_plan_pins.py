"""The plan refactor (issue 43) keeps every launch: for a grid of shapes, modes and targets (H200, H100 PCIe,
A100, MI300X, MI355X, the interpreter) the decode / verify and chunked-prefill wrappers launch exactly the
kernels, grids, tiles, modes and warps they launched before it (``data/delta_rule_plan_pins.json.gz``, written
by ``delta_rule_pins.py`` from the code at the commit it names). Nothing runs: launches are recorded."""

import delta_rule_pins as pins


def test_every_pinned_launch_is_unchanged():
    want = pins.load_pins()
    got = pins.record_all()
    assert set(got) == set(want), "the case grid changed: rewrite the pins only from the pre-refactor commit"
    diff = [k for k in want if got[k] != want[k]]
    assert not diff, (f"{len(diff)} of {len(want)} cases launch differently, e.g. {diff[0]}:\n"
                      f"  was {want[diff[0]]}\n  now {got[diff[0]]}")


def test_pins_hold_the_documented_choices():
    # a few rows of docs/kernels.md's decode rules, read back from the pins: if the recorder captured nothing
    # useful (or the wrong target), these fail
    want = pins.load_pins()
    kda_b1 = want["sm90x132|rec:kda:-5.0:12x12x128x128:T1:plain:vk:B1"]
    assert kda_b1.startswith("gated_delta_verify_wide_kernel[32, 12]") and "BV=4," in kda_b1 and "XRED=1" in kda_b1
    assert "XRED=0" in want["cpu|rec:kda:-5.0:12x12x128x128:T1:plain:vk:B1"]  # no inline PTX in the interpreter
    kda_b16 = want["sm90x132|rec:kda:-5.0:12x12x128x128:T1:plain:vk:B16"]  # 12 heads: 16 columns for B = 12-16
    assert "BV=16," in kda_b16 and "[8, 192]" in kda_b16
    assert "BV=4," in want["sm90x132|rec:kda:-5.0:12x12x128x128:T1:plain:vk:B17"]
    gdn_t5 = want["sm90x132|rec:gdn:None:16x48x128x128:T5:plain:vk:B32"]  # prepared window, 8 columns
    assert "TOKPREP=True" in gdn_t5 and "BV=8," in gdn_t5 and "lanes" not in gdn_t5
    # ROCm: no XRED / TOKPREP, so the plain GDN window takes the lanes kernel without PDL
    assert "gated_delta_verify_lanes_kernel[8, 1536]" in want["gfx942x304|rec:gdn:None:16x48x128x128:T5:plain:vk:B32"]
    # chunk-64 on sm_90 with BF16, sequential kernel with FP32 activations on CUDA, chunk-64 on ROCm
    assert want["sm90x132|chunk:gdn:None:16x48x128x128:bf16:S2xL4096:ckpt0:gsNone"].startswith("chunk_gate_cumsum_kernel")
    assert want["sm90x132|chunk:gdn:None:16x48x128x128:fp32:S2xL4096:ckpt0:gsNone"].startswith("gated_delta_chunk_kernel")
    assert want["gfx942x304|chunk:gdn:None:16x48x128x128:fp32:S2xL4096:ckpt0:gsNone"].startswith("chunk_gate_cumsum_kernel")
