"""``--dtype float32`` keeps the KDA / GDN conv window in FP32 (boot/hooks.py, conv_state_follows_fp32):
upstream keeps it in BF16 and its KDA extend then fails writing FP32 rows into it (H100, 2026-12-07)."""

import argparse
import os
import unittest
from unittest import mock

from sglang_hybrid.boot.hooks import CONV_DTYPE_ENV, conv_state_follows_fp32


class TestConvStateDtype(unittest.TestCase):
    def test_fp32_model_gets_an_fp32_conv_window_unless_the_user_chose(self):
        env = {k: v for k, v in os.environ.items() if k != CONV_DTYPE_ENV}
        with mock.patch.dict(os.environ, env, clear=True):
            self.assertFalse(conv_state_follows_fp32(argparse.Namespace(dtype="bfloat16")))
            self.assertNotIn(CONV_DTYPE_ENV, os.environ)
            self.assertTrue(conv_state_follows_fp32(argparse.Namespace(dtype="float32")))
            self.assertEqual(os.environ[CONV_DTYPE_ENV], "float32")
        with mock.patch.dict(os.environ, {**env, CONV_DTYPE_ENV: "bfloat16"}, clear=True):
            self.assertFalse(conv_state_follows_fp32(argparse.Namespace(dtype="float32")))
            self.assertEqual(os.environ[CONV_DTYPE_ENV], "bfloat16")


if __name__ == "__main__":
    unittest.main()
