"""SGLang plugin for hybrid LLMs: Kimi K3 and Qwen3.8-Flash-Next."""
