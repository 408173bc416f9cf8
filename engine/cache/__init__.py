"""The prefix cache and its records: which record kind each model cache needs (`layout`,
`kinds/`), block keys and cut points, snapshots and rebuilds, the record store and its tiers,
and the checkpointer that restores a prompt's longest stored prefix. Knows nothing about
scheduling or sampling.
"""
