"""The idle pool audit (sglang_hybrid.reliability.idle_audit) on a stand-in scheduler: what it reads, when it
says VIOLATION (a leaked lock keeps upstream's sum balanced but not ours), and the log line round trip."""

from __future__ import annotations

import logging
import unittest
from types import SimpleNamespace

from sglang_hybrid.reliability import idle_audit


def scheduler(kv_free=900, kv_evictable=100, kv_locked=0, st_free=60, st_evictable=4, st_locked=0, slots_free=8, idle=True,
              sessions=0):
    ps = SimpleNamespace(is_hybrid_ssm=True, full_available_size=kv_free, full_evictable_size=kv_evictable,
                         mamba_available_size=st_free, mamba_evictable_size=st_evictable)
    return SimpleNamespace(
        forward_ct=7,
        is_fully_idle=lambda: idle,
        pool_stats_observer=SimpleNamespace(get_pool_stats=lambda: ps, session_held_tokens=lambda: 0,
                                            session_held_mamba_slots=lambda: 0, session_held_req_count=lambda: sessions),
        tree_cache=SimpleNamespace(full_protected_size=lambda: kv_locked, mamba_protected_size=lambda: st_locked),
        req_to_token_pool=SimpleNamespace(schedulable_token_capacity=lambda size: size, mamba_pool=SimpleNamespace(size=64),
                                          size=8, available_size=lambda: slots_free),
        token_to_kv_pool_allocator=SimpleNamespace(size=1000),
    )


class TestIdleAudit(unittest.TestCase):
    def test_balanced_pools_are_ok_and_the_line_round_trips(self):
        fig = idle_audit.pool_figures(scheduler())
        self.assertEqual(fig["kv"], {"total": 1000, "free": 900, "evictable": 100, "locked": 0, "session": 0})
        self.assertEqual(fig["state"], {"total": 64, "free": 60, "evictable": 4, "locked": 0, "session": 0})
        self.assertTrue(idle_audit.figures_ok(fig))
        parsed = idle_audit.parse_audit_lines("[t] " + idle_audit.format_audit_line(3, fig) + "\n")
        self.assertEqual(parsed, [{"n": 3, "ok": True, **fig}])

    def test_a_leaked_lock_is_a_violation_even_when_the_sum_balances(self):
        fig = idle_audit.pool_figures(scheduler(kv_evictable=40, kv_locked=60))  # 900 + 40 + 60 == 1000
        self.assertFalse(idle_audit.figures_ok(fig))
        fig = idle_audit.pool_figures(scheduler(st_evictable=3, st_locked=1))
        self.assertFalse(idle_audit.figures_ok(fig))

    def test_lost_pages_slots_or_request_rows_are_violations(self):
        for kw in ({"kv_free": 899}, {"st_free": 59}, {"slots_free": 7}):
            self.assertFalse(idle_audit.figures_ok(idle_audit.pool_figures(scheduler(**kw))), kw)
        # a request row held by an open streaming session is accounted for
        self.assertTrue(idle_audit.figures_ok(idle_audit.pool_figures(scheduler(slots_free=7, sessions=1))))

    def test_hook_logs_once_per_idle_period(self):
        s = scheduler(kv_free=899)
        with self.assertLogs("sglang_hybrid.reliability", level=logging.INFO) as logs:
            idle_audit._after_on_idle(None, s)
            idle_audit._after_on_idle(None, s)  # same idle period: no second line
            s.forward_ct += 1
            idle_audit._after_on_idle(None, s)
        self.assertEqual(len(logs.records), 2)
        self.assertEqual({r.levelno for r in logs.records}, {logging.ERROR})
        self.assertIn("idle audit #2 VIOLATION", logs.records[1].getMessage())
        busy = scheduler(idle=False)
        idle_audit._after_on_idle(None, busy)
        self.assertFalse(hasattr(busy, "_sglang_hybrid_audit_n"))


if __name__ == "__main__":
    unittest.main()
