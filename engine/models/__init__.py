"""Models and their formats: resolving a model name (demo, named, LM Studio, Hugging Face, GGUF
file) to a folder, converting GGUF, loading weights (quantized or on forkv's kernels), the
fingerprint, chat template and special tokens, and the BLAS under mlx's CPU backend. Knows
nothing about requests or the prefix cache.
"""
