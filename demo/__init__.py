"""Demo assets: a tiny local Llama, its tokenizer, and LoRA adapters trained on toy tasks.

Everything here is built offline and deterministically (seeded, float32); see `demo.assets` for the
cached entry point (`python -m demo.assets`).
"""
