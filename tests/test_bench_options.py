"""`forkv bench NAME --set NAME=VALUE`: typed by the benchmark's signature, clear errors."""

import pytest

from forkv.bench.options import parse_settings


def bench(model="m", quick=False, reps=1, sizes: tuple[int, ...] | None = None,
          prompt_tokens: int = 8192, modes: tuple[str, ...] = ("none", "forkv"),
          ratio: float = 0.5, strict: bool = False, label: str = "x", spec: object = None):
    pass


def bench_with_fields(model="m", quick=False, spec: object = None, **size: int):
    pass


def test_values_take_the_type_of_the_signature():
    got = parse_settings(bench, ["sizes=512, 2048", "prompt_tokens=4_096",
                                 "modes=none,baseline,forkv", "ratio=0.25", "strict=true",
                                 "label=hi=there"])
    assert got == {"sizes": (512, 2048), "prompt_tokens": 4096,
                   "modes": ("none", "baseline", "forkv"), "ratio": 0.25, "strict": True,
                   "label": "hi=there"}


def test_dashes_are_underscores():
    assert parse_settings(bench, ["prompt-tokens=10"]) == {"prompt_tokens": 10}


@pytest.mark.parametrize("pair, message", [
    ("prompt_tokens", "NAME=VALUE"),
    ("=3", "NAME=VALUE"),
    ("prompt_tokens=lots", "prompt_tokens takes a number"),
    ("sizes=a,b", "sizes takes a number"),
    ("sizes=,", "comma-separated"),
    ("strict=maybe", "true or false"),
    ("reps=3", "--reps"),
    ("model=x", "--model"),
    ("nope=1", "Unknown setting 'nope'; this benchmark takes sizes, prompt_tokens"),
    ("spec=1", "'spec' cannot be set"),
])
def test_bad_settings_are_clear_errors(pair, message):
    with pytest.raises(ValueError, match=message):
        parse_settings(bench, [pair])


def test_extra_keywords_are_numbers_checked_by_the_benchmark():
    assert parse_settings(bench_with_fields, ["context=2048"]) == {"context": 2048}
    with pytest.raises(ValueError, match="'spec' cannot be set"):
        parse_settings(bench_with_fields, ["spec=1"])
    with pytest.raises(ValueError, match="context takes a number"):
        parse_settings(bench_with_fields, ["context=big"])


def test_every_benchmark_rejects_unknown_settings():
    from forkv.bench import BENCHMARKS, _function

    for name in BENCHMARKS:
        fn = _function(name)
        if fn is None:
            continue
        if name in ("agent", "serve"):  # take their size fields as extra keywords
            with pytest.raises(ValueError, match=f"Unknown {name} size nope"):
                fn(nope=1)
        else:
            with pytest.raises(ValueError, match="Unknown setting 'nope'"):
                parse_settings(fn, ["nope=1"])
