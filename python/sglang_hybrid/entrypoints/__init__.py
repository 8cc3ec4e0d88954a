"""Request-level fixes at upstream's entry points (tokenizer manager)."""
