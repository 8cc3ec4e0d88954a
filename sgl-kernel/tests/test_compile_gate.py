"""Cross-compile gate: every kernel config compiles for gfx942, gfx950 and sm_90 on this CPU
machine without register spills and within its LDS / shared-memory budget."""

import os
import subprocess
import sys


# The gate compiles ~300 (config, target) pairs one after another: with an empty Triton cache that took 13 min on
# the 2-core CI-sized machine (2026-12-02; 2 min with the cache warm), so a 600 s limit failed every cold run.
GATE_TIMEOUT_S = 1800


def test_every_kernel_config_compiles_without_spills_within_budget():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # needs compiled kernels
    res = subprocess.run([sys.executable, "-m", "sgl_hybrid_kernel.compile_gate"], env=env, capture_output=True, text=True,
                         timeout=GATE_TIMEOUT_S)
    table = res.stdout
    rows = [line for line in table.splitlines() if line.startswith("| ") and "kernel config" not in line]
    assert len(rows) >= 25, table + res.stderr
    for target in ("gfx942", "gfx950", "sm90"):
        assert any(f"| {target} |" in r for r in rows), target
    failed = [r for r in rows if "FAIL" in r]
    assert not failed and res.returncode == 0, "\n".join(failed) + res.stderr[-2000:]
