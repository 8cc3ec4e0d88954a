"""Attention backends registered into upstream SGLang by the plugin."""
