"""Checkpoint-name plumbing shared by the reference models.

A reference module declares, for each of its parameters, which checkpoint
tensors fill which rows (``ShardSpec``). ``load_checkpoint`` then streams the
``(name, tensor)`` pairs that SGLang's weight loader yields and fails loudly on
any unknown name, shape mismatch or missing tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Set, Tuple

import torch
from torch import nn


@dataclass(frozen=True)
class ShardSpec:
    """Checkpoint tensor ``ckpt_name`` (or its ``ckpt_index`` part) is copied into ``param_name[index]``.

    ``index`` is a tuple of slices/ints applied to the parameter (``()`` = whole);
    ``ckpt_index`` the same for the checkpoint tensor, so a TP rank loads only
    its rows / columns (``()`` = whole; issue 8).
    """

    param_name: str
    index: Tuple = ()
    ckpt_index: Tuple = ()


def load_checkpoint(model: nn.Module, weights: Iterable[Tuple[str, torch.Tensor]], mapping: Dict[str, ShardSpec]) -> Set[str]:
    """Copy checkpoint tensors into ``model`` according to ``mapping``.

    Args:
        model: module whose ``named_parameters()`` are the targets.
        weights: ``(checkpoint_name, tensor)`` pairs (SGLang's loader iterator).
        mapping: checkpoint name -> target (``ShardSpec``).

    Returns:
        The set of parameter names that were written.

    Raises:
        ValueError: an unknown checkpoint name, a shape mismatch, or a mapped
            checkpoint tensor that never arrived.
    """
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    seen: Set[str] = set()
    written: Set[str] = set()
    for name, tensor in weights:
        spec = mapping.get(name)
        if spec is None:
            raise ValueError(f"checkpoint tensor {name!r} has no place in {type(model).__name__}")
        target = params[spec.param_name]
        loader = getattr(target, "weight_loader", None)
        if loader is not None and not spec.index:
            # SGLang's own layers (vocab-parallel embedding / LM head) pad and shard.
            loader(target, tensor)
            seen.add(name)
            written.add(spec.param_name)
            continue
        if spec.ckpt_index:
            if name.endswith("A_log"):
                tensor = tensor.reshape(-1)  # K3 stores A_log 1-D; older ckpts [1, 1, H, 1]
            tensor = tensor[spec.ckpt_index]
        dst = target.data[spec.index] if spec.index else target.data
        if tuple(dst.shape) != tuple(tensor.shape):
            if dst.numel() == tensor.numel() and name.endswith("A_log"):
                tensor = tensor.reshape(dst.shape)  # K3 stores A_log 1-D; older ckpts [1, 1, H, 1]
            else:
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(dst.shape)} for {spec.param_name}{list(spec.index) or ''}"
                )
        dst.copy_(tensor.to(dst.dtype))
        seen.add(name)
        written.add(spec.param_name)
    missing: List[str] = sorted(set(mapping) - seen)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:5]}")
    return written
