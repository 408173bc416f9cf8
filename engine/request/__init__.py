"""The request path: a request becomes a sequence, the scheduler batches sequences and steps
them (prefill chunks, then decode), sampling and constraints pick tokens, and the worker thread
runs it all. Owns scheduling, sampling, constrained decoding and text streaming; knows nothing
about where checkpoints are stored or how a model folder is read.
"""
