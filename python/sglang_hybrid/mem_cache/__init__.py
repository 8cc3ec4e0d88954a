"""Hybrid radix cache (issue #3): resume points, value-aware eviction, host tier; see docs/hybrid-cache.md."""
