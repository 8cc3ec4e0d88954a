"""Kimi Delta Attention's fused decode (conv + gates + delta rule + gated RMSNorm in one launch:
``fused_decode.py``, ``triton_fused_decode.py``). KDA's gate and forms are in ``delta_rule.naive``."""
