"""Kernels and plain-torch references for hybrid-LLM layers (no SGLang import)."""
