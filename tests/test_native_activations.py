"""The MLP activations on forkv's kernels (engine/native/activations.py, src/activation.cpp):
mlx's gelu_approx and silu to float32 rounding on every ISA, every element computed the same
way wherever it sits, and moved onto a model's MLPs only for the models on the kernels."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from conftest import mlx_lm_model
from test_native import _isas


def _gelu_approx(x):
    # 0.5 x (1 + tanh(u)) in float64 as x / (1 + exp(-2u)): the same function, without the
    # cancellation that makes even float64's 1 + tanh(u) 0 for x < -9
    u = np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)
    with np.errstate(over="ignore"):  # exp(-2u) is inf far below 0: the value is -0
        return x / (1 + np.exp(-2 * u))


def _silu(x):
    return x / (1 + np.exp(-x))


@pytest.mark.parametrize("kind, reference", [("gelu_approx", _gelu_approx), ("silu", _silu)])
def test_activations_are_their_definitions_on_every_isa(lib, kind, reference):
    x = mx.concatenate([mx.linspace(-95, 95, 40_001), mx.random.normal((40_000,)) * 4,
                        mx.array([0.0, -0.0, 1e-30, -1e-30])])
    m = mx.random.normal(x.shape)
    want = reference(np.array(x, np.float64))
    for isa in _isas(lib):
        lib.set_isa(isa)
        got = np.array(lib.activation(x, kind), np.float64)
        # within float32's rounding of exp's argument (up to ~60 where x ~ -8.5) of the value;
        # mlx's own gelu_approx is off by up to 5e-5 relative where x < 0 (it forms 1 + tanh)
        assert (np.abs(got - want) <= 1e-5 * np.abs(want) + 1e-30).all(), isa
        fused = np.array(lib.activation(x, kind, m))
        assert np.array_equal(fused, np.array(mx.array(got.astype(np.float32)) * m)), isa
        # an element's value does not depend on where it sits (vector body, tail, thread)
        assert mx.array_equal(lib.activation(x[12_345:12_346], kind), lib.activation(x, kind)[
            12_345:12_346]).item(), isa
    lib.set_isa(lib.best_isa())
    strided = mx.random.normal((300, 2, 257)).transpose(2, 0, 1)
    assert mx.array_equal(lib.activation(strided, kind), lib.activation(
        mx.array(np.array(strided)), kind)).item()


def test_activation_rejects_what_it_cannot_run(lib):
    x = mx.zeros((4, 8))
    with pytest.raises(ValueError, match="unknown kind 'relu'"):
        lib.activation(x, "relu")
    with pytest.raises(ValueError, match="must be float32"):
        lib.activation(x.astype(mx.bfloat16), "silu")
    with pytest.raises(ValueError, match="mul must be float32 with x's shape"):
        lib.activation(x, "silu", mx.zeros((4, 9)))


class _Counting:
    def __init__(self, kernels):
        self.lib, self.calls = kernels, 0

    def activation(self, *args):
        self.calls += 1
        return self.lib.activation(*args)


@pytest.mark.parametrize("name", ["demo:gemma3:tiny", "demo:qwen3:tiny"])  # nn.gelu_approx; swiglu
def test_mlp_activations_move_onto_the_kernels_per_model(lib, name):
    from forkv.engine import load_model
    from forkv.engine.native.activations import use_native_activations

    # mlx-lm's own loads: forkv's loader puts every float32 model's activations on the kernels
    plain, moved = mlx_lm_model(name), mlx_lm_model(name)
    x = mx.array([[5, 9, 2, 7, 4, 3]])
    before = plain(x)
    counting = _Counting(lib)
    layers = len(moved.layers)
    assert use_native_activations(moved, counting) == layers
    assert all(type(layer.mlp).__name__ == "MLP" for layer in moved.layers)
    assert mx.array_equal(plain(x), before).item()  # the same architecture: untouched
    assert counting.calls == 0
    after = moved(x)
    assert counting.calls == layers
    assert mx.allclose(after, before, atol=1e-4).item()
    bf16 = load_model(name, dtype="bfloat16")
    use_native_activations(bf16.model, counting)
    bf16.model(x)  # bfloat16 activations stay mlx's
    assert counting.calls == layers
    assert nn.gelu_approx is not None and nn.silu(mx.array([1.0])).item() > 0.73  # mlx.nn intact


def test_logsumexp_is_mlxs_to_rounding_and_rows_stand_alone(lib):
    x = mx.random.normal((3, 262_147)) * 8
    x = mx.concatenate([x, mx.full((1, 262_147), -mx.inf)])
    for isa in _isas(lib):
        lib.set_isa(isa)
        got = lib.logsumexp(x)
        assert got.shape == (4, 1)
        want = mx.logsumexp(x[:3], axis=-1, keepdims=True)
        assert mx.allclose(got[:3], want, rtol=1e-6).item(), isa
        assert got[3, 0].item() == -float("inf")
        assert mx.array_equal(lib.logsumexp(x[1]), got[1]).item()
    lib.set_isa(lib.best_isa())
    assert np.isnan(lib.logsumexp(mx.array([1.0, float("nan")])).item())
    with pytest.raises(ValueError, match="must be float32"):
        lib.logsumexp(x.astype(mx.bfloat16))


def test_sample_draws_by_the_weights_and_never_an_excluded_token(lib):
    """Inverse-CDF draws: frequencies follow softmax(scores), -inf tokens never come up,
    u's ends pick the first and the last weighted token, and each row draws on its own."""
    weights = [0.1, 0.0, 0.2, 0.3, 0.4]
    n = 20_000
    rows = mx.broadcast_to(mx.log(mx.array(weights)), (n, len(weights)))
    u = mx.random.uniform(shape=(n,), key=mx.random.key(0))
    for isa in _isas(lib):
        lib.set_isa(isa)
        counts = np.bincount(np.array(lib.sample(rows, u)), minlength=len(weights)) / n
        assert counts[1] == 0, isa
        assert np.allclose(counts, weights, atol=0.015), (isa, counts)
    lib.set_isa(lib.best_isa())
    # a vocabulary-sized row spanning the scan's blocks, with an excluded head and tail
    x = mx.random.normal((262_147,), key=mx.random.key(1)) * 4
    x = mx.concatenate([mx.full((1500,), -mx.inf), x[1500:-1500], mx.full((1500,), -mx.inf)])
    ends = lib.sample(mx.stack([x, x, x]), mx.array([0.0, 0.5, 1.0 - 2 ** -24]))
    assert ends[0].item() == 1500 and ends[2].item() == 262_147 - 1501
    probs = np.array(mx.softmax(x))
    i = ends[1].item()  # the token where the running mass passes 0.5
    assert probs[:i].sum() <= 0.5 + 1e-4 < probs[:i + 1].sum() + 2e-4
    assert lib.sample(x, mx.array(0.5)).item() == ends[1].item()  # a row alone, same draw
    assert lib.sample(mx.full((2, 7), -mx.inf), mx.array([0.3, 0.3])).tolist() == [0, 0]
    with pytest.raises(ValueError, match="one number per row"):
        lib.sample(mx.stack([x, x]), mx.array(0.5))


def test_draw_is_the_ops_it_fuses_bit_for_bit_and_rows_stand_alone(lib):
    """draw(): lp = x - logsumexp(x), then mlx's argmax of lp (t = 0) or sample(lp / t, u),
    the same bits on every ISA; a row alone draws what it draws in a batch, with ties in lp
    going to the first token as mlx's argmax does."""
    x = mx.random.normal((6, 262_147), key=mx.random.key(2)) * 5
    x[5, 1000] = x[5, 9] = x[5].max() + 3.0  # a tie for the greedy pick: the first wins
    t = mx.array([0.0, 0.8, 1.0, 1.7, 0.05, 0.0])
    u = mx.random.uniform(shape=(6,), key=mx.random.key(3))
    for isa in _isas(lib):
        lib.set_isa(isa)
        lp = x - lib.logsumexp(x)
        want = [mx.argmax(lp[i]).item() if t[i].item() == 0 else
                lib.sample(lp[i] / t[i].item(), u[i]).item() for i in range(6)]
        tokens, picked = lib.draw(x, t, u)
        assert tokens.tolist() == want, isa
        assert picked.tolist() == [lp[i, want[i]].item() for i in range(6)], isa
        assert want[5] == 9
        for i in (1, 5):
            alone = lib.draw(x[i:i + 1], t[i:i + 1], u[i:i + 1])
            assert (alone[0].item(), alone[1].item()) == (want[i], picked[i].item()), isa
    lib.set_isa(lib.best_isa())
    gone = lib.draw(mx.full((2, 7), -mx.inf), mx.array([0.0, 1.0]), mx.array([0.3, 0.3]))
    assert gone[0].tolist() == [0, 0]
    with pytest.raises(ValueError, match="one number per row"):
        lib.draw(x, t[:2], u)
    with pytest.raises(ValueError, match="must be \\[rows, vocab\\]"):
        lib.draw(x[0], t[:1], u[:1])


def test_the_models_module_is_left_alone(lib):
    """Only a marked class's own `__call__` sees the dispatchers. The model's module keeps
    mlx.nn, so its module-level functions - Gemma 4's `geglu` is under `mx.compile` - keep
    mlx's activations: a compiled function would freeze whichever choice its first trace
    made (after a plain Gemma 4 traced it, records made in a batch differed from a fresh run
    by an ulp)."""
    import mlx_lm.models.gemma4_text as g4

    from forkv.engine.native.activations import use_native_activations

    plain, moved = mlx_lm_model("demo:gemma4:tiny"), mlx_lm_model("demo:gemma4:tiny")
    x = mx.array([[5, 9, 2, 7, 4, 3]])
    before = plain(x)  # traces geglu unmarked
    counting = _Counting(lib)
    assert use_native_activations(moved, counting) > 0
    assert g4.nn is nn and "nn" not in vars(type(moved.layers[0]))
    after = moved(x)
    layers = len(moved.layers)
    assert counting.calls == layers  # each layer's own per-layer-input gelu, not geglu
    assert mx.allclose(after, before, atol=1e-4).item()
    assert mx.array_equal(plain(x), before).item()
