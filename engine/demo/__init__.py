"""Demo models: tiny random-weight text and vision-language models with their tokenizers, built
on demand into forkv's cache (`models.ensure_demo_model`) for offline tests and `forkv demo`.
"""
