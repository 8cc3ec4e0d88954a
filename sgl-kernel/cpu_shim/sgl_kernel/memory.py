"""``weak_ref_tensor``: a tensor viewing another's memory without keeping it alive.

Upstream's breakable CUDA-graph capture (the default prefill graph backend on
CUDA) and its piecewise backend pass captured intermediates through
``weak_ref_tensor`` so the graph memory pool can reuse their blocks. The result
has the input's shape, strides, dtype and device and aliases its memory, but
holds no reference to its storage: the caller keeps the memory valid (the graph
pool does).
"""

from __future__ import annotations

import torch


def weak_ref_tensor(tensor):
    if not isinstance(tensor, torch.Tensor):
        return tensor
    construct = getattr(torch._C, "_construct_storage_from_data_pointer", None)
    if construct is None:
        raise NotImplementedError(
            "sgl_kernel.weak_ref_tensor needs torch._C._construct_storage_from_data_pointer, "
            "which this torch lacks"
        )
    if tensor.numel() == 0:
        span = 0
    else:
        span = (sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride())) + 1) * tensor.element_size()
    storage = construct(tensor.data_ptr(), tensor.device, span)
    view = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return view.set_(storage, 0, tensor.shape, tensor.stride())
