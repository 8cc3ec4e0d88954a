"""Forward metadata of our CPU (plain-torch) linear-attention paths, shared by the KDA
and GDN backends (``kda_backend.py``, ``gdn_backend.py``).

On CPU those backends skip upstream's kernel dispatchers, so they build only the
base class's metadata plus the prefix-cache track indices their torch paths read
(``mamba_track_mask_indices`` ``[n]`` int64 and the matching
``conv_states_mask_indices``), and copy tracked rows to their checkpoint slots after a
torch decode step; on a GPU upstream's own metadata is used unchanged.
A class using this mixin sets ``self._torch_path``.
"""

from __future__ import annotations

from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase


class CpuLinearAttnMetadataMixin:
    """Put first in the bases, before upstream's KDA/GDN backend class."""

    def init_forward_metadata(self, forward_batch):
        if not self._torch_path:
            return super().init_forward_metadata(forward_batch)
        MambaAttnBackendBase.init_forward_metadata(self, forward_batch)
        md = self.forward_metadata
        if md.has_mamba_track_mask:
            if md.mamba_track_mask_indices is None:
                md.mamba_track_mask_indices = forward_batch.mamba_track_mask.nonzero(as_tuple=True)[0]
            md.conv_states_mask_indices = forward_batch.mamba_track_indices[md.mamba_track_mask_indices]

    def supports_prefill_graph_extend(self) -> bool:
        return False if self._torch_path else super().supports_prefill_graph_extend()

    def _track_decode_torch(self, forward_batch, conv_pool, ssm_pool, idx):
        """Copy the state of tracked rows to their checkpoint slots (upstream
        does this with a Triton scatter; same semantics, per layer)."""
        mask = forward_batch.mamba_track_mask
        if mask is None or not bool(mask.any()):
            return
        rows = mask.nonzero(as_tuple=True)[0]
        dst = self.forward_metadata.mamba_track_indices[rows].long()
        src = idx[rows]
        conv_pool[dst] = conv_pool[src]
        ssm_pool[dst] = ssm_pool[src]
