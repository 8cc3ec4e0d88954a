"""MoE-side hooks of the plugin (issue 5, Wiring)."""
