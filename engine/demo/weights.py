"""Write a freshly initialised model into a folder: the one save step every demo builder shares.

Text demos (models.py) and vision demos (vlm.py) both end here, so neither imports the
other for it. Knows nothing about architectures or tokenizers.
"""

from __future__ import annotations

import json
from pathlib import Path


def save_random_model(model, config: dict, folder: Path, damp: str) -> None:
    """Write a freshly initialised model's weights and configs into `folder`.

    Random init gives unit-variance embeddings; weights whose name contains `damp` are halved
    so activations in the tied LM head stay in a range where bfloat16 and float32 runs both
    give varied, non-degenerate text.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten

    weights = dict(tree_flatten(model.parameters()))
    weights = {k: (v * 0.5 if damp in k else v) for k, v in weights.items()}
    mx.eval(weights)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": config["eos_token_id"]}))
