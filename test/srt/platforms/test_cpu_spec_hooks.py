"""CPU hooks of the speculative path (``platforms/cpu_spec.py``, issue 6): the commit after
verify copies exactly the last accepted step's state (never a rejected one), into the
request's slot and, when the accepted prefix crosses the checkpoint grid, into its track slot."""

from __future__ import annotations

import unittest
from types import SimpleNamespace

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_hybrid.platforms.cpu_spec import require_chain_speculation_cpu, scatter_states_after_verify_torch

L, SLOTS, ROWS, STEPS = 2, 6, 3, 4


def caches():
    # Every step's state is filled with a value naming (layer, row, step); slots start at -1.
    step_val = (torch.arange(L).view(L, 1, 1) * 100 + torch.arange(ROWS).view(1, ROWS, 1) * 10
                + torch.arange(STEPS).view(1, 1, STEPS)).float()
    return SimpleNamespace(
        temporal=torch.full((L, SLOTS, 2, 3), -1.0),
        intermediate_ssm=step_val.view(L, ROWS, STEPS, 1, 1).expand(L, ROWS, STEPS, 2, 3).clone(),
        conv=[torch.full((L, SLOTS, 5, 3), -1.0)],
        intermediate_conv_window=[step_val.view(L, ROWS, STEPS, 1, 1).expand(L, ROWS, STEPS, 5, 3).clone()],
    )


class TestCommitAfterVerify(unittest.TestCase):
    def test_slot_gets_last_accepted_step_and_track_slot_its_crossing_step(self):
        c = caches()
        slots = torch.tensor([4, 1, 2])
        last_step = torch.tensor([3, 0, 1])  # request 0 accepted all 3 drafts, request 1 none, request 2 one
        track = torch.tensor([5, 3, 0])
        track_step = torch.tensor([2, -1, -1])  # only request 0 crossed the grid, after its 3rd row
        scatter_states_after_verify_torch(c, slots, last_step, track, track_step)
        for state in (c.temporal, c.conv[0]):
            for layer in range(L):
                got = state[layer, :, 0, 0].tolist()
                want = [-1.0] * SLOTS
                for row, (slot, step) in enumerate(zip(slots.tolist(), last_step.tolist())):
                    want[slot] = layer * 100 + row * 10 + step
                want[5] = layer * 100 + 0 * 10 + 2
                self.assertEqual(got, want)

    def test_track_plan_needs_steps(self):
        with self.assertRaisesRegex(ValueError, "mamba_steps_to_track"):
            scatter_states_after_verify_torch(caches(), torch.tensor([1]), torch.tensor([0]), torch.tensor([2]), None)


class TestQsaChainCheck(unittest.TestCase):
    def test_any_chain_width_passes_tree_raises(self):
        require_chain_speculation_cpu(None, ForwardMode.TARGET_VERIFY, SimpleNamespace(topk=1, draft_token_num=5))
        require_chain_speculation_cpu(None, ForwardMode.DECODE, SimpleNamespace(topk=4))
        with self.assertRaisesRegex(NotImplementedError, "topk 1"):
            require_chain_speculation_cpu(None, ForwardMode.TARGET_VERIFY, SimpleNamespace(topk=2, draft_token_num=4))


if __name__ == "__main__":
    unittest.main()
