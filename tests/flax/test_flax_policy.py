"""The Flax layer's config objects: PrecisionPolicy and LayerPrecision are checked at construction (types, not
truthiness; a str where patterns are expected is ONE pattern), the modules refuse what is not a config object,
and the policy's pattern matching against an independent glob matcher (hypothesis, bounded)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import jax_mxfp8 as mx
import jax_mxfp8.flax as mf

PROPERTY = settings(max_examples=150, deadline=None, database=None, derandomize=True)


# ------------------------------------------------------------------------------ a str is one pattern
def test_a_str_of_bf16_layers_is_one_pattern():
    """bf16_layers="lm_head" makes lm_head BF16 (it was split into characters, so lm_head stayed MXFP8), and
    "blocks.3.*" does not leave a lone "*" that turns every layer BF16."""
    head = mf.PrecisionPolicy.mxfp8(bf16_layers="lm_head")
    assert head.rules == (("lm_head", mf.BF16),)
    assert head.for_layer("lm_head").gemm == "bf16" and head.for_layer("blocks.0.mlp").gemm == "mxfp8"
    last = mf.PrecisionPolicy.mxfp8(bf16_layers="blocks.3.*")
    assert last.for_layer("blocks.3.mlp").gemm == "bf16"
    assert last.for_layer("blocks.1.mlp").gemm == "mxfp8" and last.for_layer("lm_head").gemm == "mxfp8"
    assert last == mf.PrecisionPolicy.mxfp8(bf16_layers=["blocks.3.*"])
    # the same rule for the other sequence-of-names argument: one row for one name
    assert head.table("lm_head").count("\n") == 2


# ------------------------------------------------------------------------------ construction checks
BAD_POLICIES = {
    "bf16_layers [None]": (lambda: mf.PrecisionPolicy.mxfp8(bf16_layers=[None]), r"bf16_layers\[0\]=None"),
    "bf16_layers [3]": (lambda: mf.PrecisionPolicy.mxfp8(bf16_layers=[3]), r"bf16_layers\[0\]=3"),
    "bf16_layers ['']": (lambda: mf.PrecisionPolicy.mxfp8(bf16_layers=[""]), r"bf16_layers\[0\]=''"),
    "bf16_layers None": (lambda: mf.PrecisionPolicy.mxfp8(bf16_layers=None), "bf16_layers=None"),
    "bf16_layers 3": (lambda: mf.PrecisionPolicy.mxfp8(bf16_layers=3), "bf16_layers=3"),
    "bf16_layers bytes": (lambda: mf.PrecisionPolicy.mxfp8(bf16_layers=b"lm_head"), "bf16_layers=b'lm_head'"),
    "rules str precision": (lambda: mf.PrecisionPolicy(rules=(("a", "bf16"),)), r"rules\[0\] precision='bf16'"),
    "rules lone str": (lambda: mf.PrecisionPolicy(rules=("a",)), r"rules\[0\]='a' must be a \(pattern"),
    "rules a str": (lambda: mf.PrecisionPolicy(rules="ab"), "rules='ab'"),
    "rules None": (lambda: mf.PrecisionPolicy(rules=None), "rules=None"),
    "rules triple": (lambda: mf.PrecisionPolicy(rules=(("a", mf.BF16, 1),)), r"rules\[0\]="),
    "rules pattern int": (lambda: mf.PrecisionPolicy(rules=((3, mf.BF16),)), r"rules\[0\] pattern\[0\]=3"),
    "default str": (lambda: mf.PrecisionPolicy(default="bf16"), "default='bf16' must be a LayerPrecision"),
    "default None": (lambda: mf.PrecisionPolicy(default=None), "default=None"),
    "for_layer int": (lambda: mf.PrecisionPolicy().for_layer(3), "name=3"),
    "table None": (lambda: mf.PrecisionPolicy().table(None), "layer_names=None"),
    "mxfp8 weight_grad": (lambda: mf.PrecisionPolicy.mxfp8(weight_grad="fp4"), "weight_grad='fp4'"),
    "mxfp8 hadamard str": (lambda: mf.PrecisionPolicy.mxfp8(hadamard="no"), "hadamard='no'"),
}

BAD_PRECISIONS = {
    "quantize_epilogue 'no'": (lambda: mf.LayerPrecision(quantize_epilogue="no"), "quantize_epilogue='no'"),
    "hadamard 'no'": (lambda: mf.LayerPrecision(hadamard="no"), "hadamard='no'"),
    "hadamard 1": (lambda: mf.LayerPrecision(hadamard=1), "hadamard=1"),
    "hadamard None": (lambda: mf.LayerPrecision(hadamard=None), "hadamard=None"),
    "quantize_epilogue 0": (lambda: mf.LayerPrecision(quantize_epilogue=0), "quantize_epilogue=0"),
    "quantize_epilogue array": (
        lambda: mf.LayerPrecision(quantize_epilogue=np.array([True, False])),
        "quantize_epilogue=array",
    ),
    "gemm None": (lambda: mf.LayerPrecision(gemm=None), "gemm=None"),
    "attention list": (lambda: mf.LayerPrecision(attention=["bf16"]), r"attention=\['bf16'\]"),
    "grad_rounding int": (lambda: mf.LayerPrecision(grad_rounding=1), "grad_rounding=1"),
    "weight_grad None": (lambda: mf.LayerPrecision(weight_grad=None), "weight_grad=None"),
}

BAD_MODULES = {
    "MXLinear precision str": (lambda: mf.MXLinear(64, 32, precision="bf16", rngs=nnx.Rngs(0)), "precision='bf16'"),
    "MXLinear use_bias str": (lambda: mf.MXLinear(64, 32, use_bias="no", rngs=nnx.Rngs(0)), "use_bias='no'"),
    "MXRMSNorm precision": (lambda: mf.MXRMSNorm(64, precision=None), "precision=None"),
    "MXAttention precision": (lambda: mf.MXAttention(64, 2, precision="bf16", rngs=nnx.Rngs(0)), "precision="),
    "MXAttention config": (lambda: mf.MXAttention(64, 2, attention_config="x", rngs=nnx.Rngs(0)), "attention_config"),
    "MXAttention use_rope": (lambda: mf.MXAttention(64, 2, use_rope="no", rngs=nnx.Rngs(0)), "use_rope='no'"),
    "MXMLP precision": (lambda: mf.MXMLP(64, 128, precision="bf16", rngs=nnx.Rngs(0)), "precision='bf16'"),
    "TransformerBlock name": (lambda: mf.TransformerBlock(64, 2, name=3, rngs=nnx.Rngs(0)), "name=3"),
    "TransformerBlock config": (
        lambda: mf.TransformerBlock(64, 2, attention_config={}, rngs=nnx.Rngs(0)),
        "attention_config",
    ),
    "linen MXDense precision": (lambda: mf.linen.MXDense(32, precision="bf16"), "precision='bf16'"),
    "linen MXDense features": (lambda: mf.linen.MXDense(0), "features=0"),
    "linen MXDense use_bias": (lambda: mf.linen.MXDense(32, use_bias="no"), "use_bias='no'"),
    "linen MXRMSNorm eps": (lambda: mf.linen.MXRMSNorm(eps=0.0), "eps=0.0"),
    "linen MXRMSNorm precision": (lambda: mf.linen.MXRMSNorm(precision="bf16"), "precision='bf16'"),
    "linen MXAttention heads": (lambda: mf.linen.MXAttention(0), "num_heads=0"),
    "linen MXAttention config": (lambda: mf.linen.MXAttention(2, attention_config="x"), "attention_config"),
    "linen MXAttention use_rope": (lambda: mf.linen.MXAttention(2, use_rope=1), "use_rope=1"),
    "linen TransformerBlock policy": (lambda: mf.linen.TransformerBlock(2, policy="bf16"), "policy"),
    "linen TransformerBlock mlp_ratio": (lambda: mf.linen.TransformerBlock(2, mlp_ratio=0), "mlp_ratio=0"),
    "linen TransformerBlock layer_name": (lambda: mf.linen.TransformerBlock(2, layer_name=None), "layer_name"),
}


@pytest.mark.parametrize("name", list(BAD_POLICIES) + list(BAD_PRECISIONS) + list(BAD_MODULES))
def test_config_objects_and_modules_refuse_bad_arguments_at_construction(name):
    fn, match = {**BAD_POLICIES, **BAD_PRECISIONS, **BAD_MODULES}[name]
    with pytest.raises(ValueError, match=match):
        fn()


def test_good_arguments_are_kept_normalised():
    """NumPy bools are accepted and stored as Python bools; rules given as lists become hashable tuples."""
    p = mf.LayerPrecision(hadamard=np.bool_(True), quantize_epilogue=np.False_)
    assert p.hadamard is True and p.quantize_epilogue is False
    assert p == mf.LayerPrecision(hadamard=True, quantize_epilogue=False)
    policy = mf.PrecisionPolicy(rules=[["blocks.*", mf.BF16]])
    assert policy.rules == (("blocks.*", mf.BF16),) and hash(policy) == hash(mf.PrecisionPolicy(rules=policy.rules))
    assert mf.PrecisionPolicy.mxfp8(bf16_layers=(p for p in ("a", "b"))).rules == (("a", mf.BF16), ("b", mf.BF16))
    # the configs still construct modules (NNX and Linen) and accept an AttentionConfig
    mf.MXAttention(64, 2, attention_config=mx.AttentionConfig(), precision=p, rngs=nnx.Rngs(0))
    mf.linen.TransformerBlock(2, policy=policy, attention_config=mx.AttentionConfig())


# ------------------------------------------------------------------------------ pattern matching (properties)
def glob_matches(name: str, pattern: str) -> bool:
    """An independent matcher of the glob subset the strategies draw: "*" any run of characters (dots
    included), "?" one character, anything else itself; the whole name must match."""
    if not pattern:
        return not name
    head, rest = pattern[0], pattern[1:]
    if head == "*":
        return any(glob_matches(name[i:], rest) for i in range(len(name) + 1))
    return bool(name) and (head == "?" or head == name[0]) and glob_matches(name[1:], rest)


SEGMENTS = st.sampled_from(["blocks", "0", "1", "3", "mlp", "attn", "lm_head", "up", "a"])
NAMES = st.lists(SEGMENTS, min_size=1, max_size=4).map(".".join)
PATTERNS = st.lists(st.sampled_from(["blocks", "0", "3", "mlp", "attn", "lm_head", "*", "?", ".", "a"]),
                    min_size=1, max_size=5).map("".join)  # fmt: skip
PRECISION_OF = {"mxfp8": mf.MXFP8, "bf16": mf.BF16, "sr": mf.LayerPrecision(grad_rounding="stochastic")}


@PROPERTY
@given(layers=st.lists(PATTERNS, max_size=4), names=st.lists(NAMES, min_size=1, max_size=6))
def test_bf16_layers_match_exactly_the_names_some_pattern_matches(layers, names):
    policy = mf.PrecisionPolicy.mxfp8(bf16_layers=layers)
    for name in names:
        want = "bf16" if any(glob_matches(name, p) for p in layers) else "mxfp8"
        assert policy.for_layer(name).gemm == want, (name, layers)
    # the order of the patterns does not matter, and one pattern given as a str is that pattern
    for perm in itertools.islice(itertools.permutations(layers), 6):
        assert [mf.PrecisionPolicy.mxfp8(bf16_layers=perm).for_layer(n) for n in names] == [
            policy.for_layer(n) for n in names
        ]
    for p in layers:
        assert mf.PrecisionPolicy.mxfp8(bf16_layers=p).rules == mf.PrecisionPolicy.mxfp8(bf16_layers=[p]).rules


@PROPERTY
@given(
    rules=st.lists(st.tuples(PATTERNS, st.sampled_from(sorted(PRECISION_OF))), max_size=5),
    default=st.sampled_from(sorted(PRECISION_OF)),
    names=st.lists(NAMES, min_size=1, max_size=6),
)
def test_the_last_matching_rule_wins_else_the_default(rules, default, names):
    policy = mf.PrecisionPolicy(default=PRECISION_OF[default], rules=[(p, PRECISION_OF[k]) for p, k in rules])
    for name in names:
        matching = [k for p, k in rules if glob_matches(name, p)]
        assert policy.for_layer(name) == PRECISION_OF[matching[-1] if matching else default], (name, rules)
    table = policy.table(names).splitlines()
    assert len(table) == 2 + len(names)
    for name, row in zip(names, table[2:]):
        assert row.startswith(f"| {name} | ")


@PROPERTY
@given(name=NAMES)
def test_a_name_without_wildcards_matches_only_itself(name):
    policy = mf.PrecisionPolicy.mxfp8(bf16_layers=name)
    assert policy.for_layer(name).gemm == "bf16"
    for other in (name + ".x", "x." + name, name[:-1]):
        assert policy.for_layer(other).gemm == "mxfp8"
