"""Benchmark clients: ``python -m sglang_hybrid.bench.replay`` replays a Mooncake trace."""
