"""Vision-language models: image inputs and prompt layout, the per-family vision towers (Gemma,
Qwen), the vision-feature cache, and checkpoints at image boundaries. Only `loader` imports
mlx-vlm, lazily.
"""
