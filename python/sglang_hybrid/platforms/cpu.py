"""What upstream SGLang 0.5.23 needs to serve our hybrid models on a CPU.

Each function installs one hook and says why; ``plugin.register`` calls them
only when :func:`sglang_hybrid.platforms.current_platform` is the CPU.
"""

from __future__ import annotations

import logging
import os

import torch

from sglang_hybrid.patches import register_patches

logger = logging.getLogger(__name__)


def default_conv_state_fp32() -> None:
    """Keep the KDA/GDN conv window in FP32 on CPU (upstream defaults it to BF16).

    A BF16 window would make a prefix-cache resume differ from a full prefill
    of the same tokens in an FP32 model. Respected only if the user did not set
    ``SGLANG_MAMBA_CONV_DTYPE``; read by upstream when the state pool is built.
    """
    if "SGLANG_MAMBA_CONV_DTYPE" not in os.environ:
        os.environ["SGLANG_MAMBA_CONV_DTYPE"] = "float32"


def _extra_buffer_supported() -> bool:
    return True


def allow_extra_buffer() -> None:
    """Allow ``--mamba-radix-cache-strategy extra_buffer`` on CPU.

    Upstream gates it on a GPU platform because its state snapshots are Triton
    scatters; our CPU KDA backend writes them in torch.
    """
    register_patches(__name__, only=("_extra_buffer_supported",))


def _pin_memory_without_gpu(original_fn, self, *args, **kwargs):
    # Page-locked host memory only speeds up host->GPU copies; with no GPU the
    # request is meaningless and a CUDA-build torch raises "Found no NVIDIA driver".
    if not torch.cuda.is_available():
        return self
    return original_fn(self, *args, **kwargs)


def pin_memory_noop_without_gpu() -> None:
    """``ScheduleBatch.prepare_for_decode`` pins a tensor unconditionally (anchor checked)."""
    register_patches(__name__, only=("_pin_memory_without_gpu",))
