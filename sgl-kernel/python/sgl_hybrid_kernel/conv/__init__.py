"""Short causal depthwise convolution (the ``short_conv`` of KDA / GDN layers)."""

from sgl_hybrid_kernel.conv.reference import causal_conv1d, causal_conv1d_step

__all__ = ["causal_conv1d", "causal_conv1d_step"]
