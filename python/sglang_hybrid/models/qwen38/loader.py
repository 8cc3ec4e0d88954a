"""Model-level loading of the Qwen3.8 reference text model, cut to one tensor-parallel rank (no server:
tests and benchmarks of ``parallel/qwen38_tp.py``). Here, not in ``qwen38_tp.py``, so that the model
module (which imports the sharding) and the sharding module do not import each other."""

from __future__ import annotations

import contextlib
import os
from typing import Iterable, Tuple

import torch
from torch import nn

from sglang_hybrid.models.kimi_k3.weights import load_checkpoint
from sglang_hybrid.models.qwen38 import model as qwen_model
from sglang_hybrid.models.qwen38.model import Qwen38ReferenceForConditionalGeneration, Qwen38TextModel, text_config_of
from sglang_hybrid.parallel.qwen38_tp import shard_qwen38_text_model
from sglang_hybrid.parallel.spec import ParallelSpec


class _ReplicatedTable(nn.Module):
    """``[vocab, D]`` embedding held whole on every rank (model-level runs, no upstream TP group)."""

    def __init__(self, vocab_size: int, hidden_size: int, *args, **kwargs):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(input_ids, self.weight)


@contextlib.contextmanager
def _replicated_vocab():
    # Qwen38TextModel builds upstream's VocabParallelEmbedding, which needs a
    # published SGLang runtime (a server); a model-level run holds the table whole.
    original = qwen_model.VocabParallelEmbedding
    qwen_model.VocabParallelEmbedding = _ReplicatedTable
    try:
        yield
    finally:
        qwen_model.VocabParallelEmbedding = original


def load_qwen38_text_model(model_dir: str, spec: ParallelSpec = ParallelSpec()) -> Tuple[nn.Module, torch.Tensor]:
    """Build and load the text model of a Qwen3.8 checkpoint, cut to ``spec``'s rank.

    Returns ``(model, lm_head [vocab, D])``; the model's ``parallel`` attribute is ``spec``.
    """
    from safetensors.torch import load_file
    from sglang.srt.configs.qwen4_exp import Qwen4ExpConfig

    text = text_config_of(Qwen4ExpConfig.from_pretrained(model_dir))
    with _replicated_vocab():
        model = Qwen38TextModel(text)
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    lm_head = tensors.pop("lm_head.weight", None)
    named: Iterable = Qwen38ReferenceForConditionalGeneration.target_weights(tensors.items())
    holder = nn.Module()  # the mapping names parameters as the full model does ("model.…")
    holder.model = model
    load_checkpoint(holder, named, model.checkpoint_mapping())
    if lm_head is None:  # tied
        lm_head = model.embed_tokens.weight.data
    return shard_qwen38_text_model(model, spec), lm_head
