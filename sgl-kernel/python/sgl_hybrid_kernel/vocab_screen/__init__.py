"""Vocab screening: low-precision logits for the whole vocabulary, the best candidates recomputed exactly (issue 6)."""

from sgl_hybrid_kernel.vocab_screen.reference import (
    FORMATS,
    QuantizedRows,
    ScreenedLogits,
    approximate_logits,
    dequantize_rows,
    quantize_rows,
    screen_logits,
)

__all__ = ["FORMATS", "QuantizedRows", "ScreenedLogits", "approximate_logits", "dequantize_rows", "quantize_rows",
           "screen_logits"]
