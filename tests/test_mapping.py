"""The mapping engine on hand-made rules: strict both ways, messages that name the key, the rule and file:line."""

import re
import textwrap

import pytest

from converter.errors import MappingError
from converter.mapping import load_mapping, plan, target_path

RULES = """
family: toy
targets:
  flax:
    - name: conv-kernel
      match: '(blocks\\.\\d+\\.conv)\\.weight'
      to: '{1}.kernel'
      transpose: [2, 3, 1, 0]
    - name: any-bias
      match: '(.+)\\.bias'
      to: '{1}.bias'
"""


def _mapping(tmp_path, text=RULES):
    path = tmp_path / "toy.yaml"
    path.write_text(textwrap.dedent(text))
    return load_mapping(path)


def _layers(n, weight_name, weight_shape):
    """n conv layers, each a weight (by the side's name and layout) and a bias of 8."""
    return {
        key: shape
        for i in range(n)
        for key, shape in ((f"blocks.{i}.conv.{weight_name}", weight_shape), (f"blocks.{i}.conv.bias", (8,)))
    }


def _source(n):
    return _layers(n, "weight", (8, 4, 3, 3))


def _targets(n):
    return _layers(n, "kernel", (3, 3, 4, 8))


def test_indices_past_ten_pair_by_index_not_sort_order(tmp_path):
    assignments = plan(_mapping(tmp_path), "flax", _source(12), _targets(12))
    pairs = {a.source_key: a.target_key for a in assignments}
    assert pairs["blocks.10.conv.weight"] == "blocks.10.conv.kernel"
    assert pairs["blocks.2.conv.weight"] == "blocks.2.conv.kernel"
    assert target_path("blocks.10.conv.kernel") == ("blocks", 10, "conv", "kernel")


def test_key_matched_by_two_rules_names_both(tmp_path):
    text = (
        RULES
        + """    - name: greedy
      match: 'blocks\\.0\\.conv\\.bias'
      to: 'blocks.0.conv.bias'
"""
    )
    with pytest.raises(MappingError) as err:
        plan(_mapping(tmp_path, text), "flax", _source(1), _targets(1))
    message = str(err.value)
    assert "'blocks.0.conv.bias' is matched by 2 rules" in message
    assert "any-bias (" in message and "greedy (" in message and "toy.yaml:" in message


def test_missing_transpose_is_a_shape_mismatch(tmp_path):
    text = RULES.replace("      transpose: [2, 3, 1, 0]\n", "")
    with pytest.raises(MappingError, match=r"shape mismatch for 'blocks.0.conv.weight'.*expected \[3, 3, 4, 8\]"):
        plan(_mapping(tmp_path, text), "flax", _source(1), _targets(1))


def test_unfilled_and_unknown_leaves(tmp_path):
    targets = _targets(2)
    with pytest.raises(MappingError, match=r"'blocks.1.conv.kernel' is filled by no source key"):
        plan(_mapping(tmp_path), "flax", _source(1), targets)
    with pytest.raises(MappingError, match=r"maps to 'blocks.2.conv.kernel'.*does not have"):
        plan(_mapping(tmp_path), "flax", _source(3), targets)


def test_yaml_errors_name_file_and_line(tmp_path):
    with pytest.raises(MappingError, match=r"toy.yaml:\d+: YAML syntax error"):
        _mapping(tmp_path, RULES + "    - name: [unclosed\n")
    with pytest.raises(MappingError, match=r"toy.yaml:5: unknown rule field\(s\): transpos\b"):
        _mapping(tmp_path, RULES.replace("transpose:", "transpos:"))


def test_named_patterns_are_written_once_and_unknown_names_are_errors(tmp_path):
    named = RULES.replace("family: toy\n", "family: toy\npatterns:\n  layer: 'blocks\\.\\d+\\.conv'\n").replace(
        "match: '(blocks\\.\\d+\\.conv)\\.weight'", "match: '({layer})\\.weight'"
    )
    assert "{layer}" in named
    shapes = _source(3)
    target = {k.replace("weight", "kernel"): (3, 3, 4, 8) if k.endswith("weight") else v for k, v in shapes.items()}
    assert len(plan(_mapping(tmp_path, named), "flax", shapes, target)) == len(shapes)
    with pytest.raises(MappingError, match=r"toy\.yaml:\d+: unknown pattern \{nothing\}"):
        _mapping(tmp_path, named.replace("({layer})", "({nothing})"))
    # a name may hold digits (after its first character): {conv3d} is the pattern, never regex text
    digits = named.replace("layer", "conv3d")
    assert len(plan(_mapping(tmp_path, digits), "flax", shapes, target)) == len(shapes)


FORMAT = """
family: toy
targets:
  flax: []
source_formats:
  release:
    signature: [up.0.w]
    lookups:
      level: {0: 1, 1: 0}
    rules:
      - name: up
        match: 'up\\.(?P<n>\\d+)\\.w'
        to: 'blocks.{n}.w'
        lookup: {LOOKUP}
"""


@pytest.mark.parametrize(
    ("lookup", "needle"),
    [("{m: level}", "lookup names group 'm'"), ("{n: levels}", "unknown lookup table 'levels' (declared: level)")],
)
def test_lookup_that_cannot_apply_is_refused_when_loading(tmp_path, lookup, needle):
    with pytest.raises(MappingError, match=re.escape(needle)) as caught:
        _mapping(tmp_path, FORMAT.replace("{LOOKUP}", lookup))
    rule_line = FORMAT.splitlines().index("      - name: up") + 1
    assert f"toy.yaml:{rule_line}:" in str(caught.value)


def test_lookup_renumbers_by_index(tmp_path):
    from converter.mapping import rename_keys

    rules = _mapping(tmp_path, FORMAT.replace("{LOOKUP}", "{n: level}"))
    result = rename_keys(
        rules, rules.formats["release"], {"up.0.w": (2,), "up.1.w": (3,)}, {"blocks.1.w": (2,), "blocks.0.w": (3,)}, {}
    )
    assert not result.problems
    assert {a.source_key: a.target_key for a in result.assignments} == {"up.0.w": "blocks.1.w", "up.1.w": "blocks.0.w"}


def _renamed(rules, fmt: str, keys: list[str], config: dict) -> dict:
    from converter.mapping import rename_keys

    targets = {f"blocks.{i}.w": (1,) for i in range(8)}
    result = rename_keys(rules, rules.formats[fmt], dict.fromkeys(keys, (1,)), targets, config)
    assert not result.conflicts and not result.twice, result.problems
    return {a.source_key: a.target_key for a in result.assignments}


def test_index_expression_counts_levels_from_the_config(tmp_path):
    """The LDM decoder's levels, numbered from the top, at any depth: the index is computed from the config."""
    rules = _mapping(tmp_path, FORMAT.replace("        lookup: {LOOKUP}", "        index: {n: 'len(widths) - 1 - n'}"))
    for depth in (2, 3, 5):
        keys = [f"up.{i}.w" for i in range(depth)]
        renamed = _renamed(rules, "release", keys, {"widths": [8] * depth})
        assert renamed == {f"up.{i}.w": f"blocks.{depth - 1 - i}.w" for i in range(depth)}
    # a config without the field, or an index the formula sends below zero: the key is unfit, said with the formula
    from converter.mapping import rename_keys

    for config in ({}, {"widths": [8]}):
        result = rename_keys(rules, rules.formats["release"], {"up.1.w": (1,)}, {"blocks.0.w": (1,)}, config)
        assert any("len(widths) - 1 - n" in p for p in result.unfit), result.unfit


@pytest.mark.parametrize(
    ("expression", "needle"),
    [
        ("__import__('os').getcwd()", "integers, names, len(name)"),
        ("n ** 40", "integers, names, len(name)"),
        ("n / 2", "integers, names, len(name)"),
        ("n.real", "integers, names, len(name)"),
        ("len(n, n)", "integers, names, len(name)"),
        ("n +", "is not a formula"),
        ("1" + " + 1" * 60, "at most 120 characters"),
    ],
)
def test_index_expression_is_a_small_formula_checked_when_loading(tmp_path, expression, needle):
    text = FORMAT.replace("        lookup: {LOOKUP}", f'        index: {{n: "{expression}"}}')
    with pytest.raises(MappingError, match=re.escape(needle)):
        _mapping(tmp_path, text)


SHARED = """
family: toy
lookups:
  level: {0: 1, 1: 0}
rule_sets:
  ups:
    - name: up
      match: 'up\\.(?P<n>\\d+)\\.w'
      to: 'blocks.{n}.w'
      lookup: {n: level}
targets:
  flax: []
source_formats:
  plain:
    signature: [up.0.w]
    rules:
      - use: ups
  checkpoint:
    signature: [model.up.0.w]
    prefix: model.
    rules:
      - use: ups
    drop:
      - name: other-models
        match: '(?!model\\.).+'
"""


def test_rule_sets_and_file_lookups_are_shared_by_name(tmp_path):
    rules = _mapping(tmp_path, SHARED)
    plain, checkpoint = rules.formats["plain"], rules.formats["checkpoint"]
    assert [r.shown_name for r in plain.rules] == ["ups/up"] and plain.rules == checkpoint.rules
    assert _renamed(rules, "plain", ["up.0.w", "up.1.w"], {}) == {"up.0.w": "blocks.1.w", "up.1.w": "blocks.0.w"}
    # under a prefix the rules see the keys without it; the drop rules see only the keys outside it
    renamed = _renamed(rules, "checkpoint", ["model.up.0.w", "model.up.1.w", "unet.x"], {})
    assert renamed == {"model.up.0.w": "blocks.1.w", "model.up.1.w": "blocks.0.w"}
    with pytest.raises(MappingError, match=re.escape("'use' names 'downs', not a rule set (declared: ups)")):
        _mapping(tmp_path, SHARED.replace("- use: ups\n    drop", "- use: downs\n    drop"))


ALIASED = SHARED.replace("  ups:\n", "  ups: &shared\n").replace(
    "    rules:\n      - use: ups\n  checkpoint:", "    rules: *shared\n  checkpoint:"
)
MERGED = SHARED.replace("    prefix: model.\n", "    prefix: model.\n    lookups:\n      <<: {level: {0: 1}}\n")


@pytest.mark.parametrize(("text", "needle"), [(ALIASED, "a YAML alias"), (MERGED, "a YAML merge key")])
def test_yaml_anchors_aliases_and_merge_keys_are_refused(tmp_path, text, needle):
    assert text != SHARED
    with pytest.raises(MappingError, match=r"toy\.yaml:\d+: " + re.escape(needle)):
        _mapping(tmp_path, text)


FUSED = """
family: toy
targets:
  flax: []
source_formats:
  release:
    signature: [attn.qkv.w]
    rules:
      - name: fused
        match: 'attn\\.qkv\\.(w|b)'
        to: 'attn.to_{part}.{1}'
        split: {axis: 0, parts: [q, k, v], groups: heads}
      - name: swapped
        match: 'ff\\.w1'
        to: 'ff.proj'
        reorder: {axis: 0, order: [1, 0]}
"""


def test_a_split_takes_each_part_s_block_of_every_group_and_a_reorder_puts_blocks_back(tmp_path):
    """A fused projection stored head by head ([h0: q k v, h1: q k v]) becomes q, k and v; a reorder swaps halves,
    and its inverse (export's) swaps them back."""
    import numpy as np

    from converter.mapping import apply_ops, inverse_ops, rename_keys

    rules = _mapping(tmp_path, FUSED)
    heads, head_dim, width = 2, 3, 4
    source = {"attn.qkv.w": (heads * 3 * head_dim, width), "attn.qkv.b": (heads * 3 * head_dim,), "ff.w1": (6, 4)}
    expected = {f"attn.to_{p}.{s}": (heads * head_dim, *shape[1:]) for p in "qkv" for s, shape in
                (("w", source["attn.qkv.w"]), ("b", source["attn.qkv.b"]))} | {"ff.proj": (6, 4)}  # fmt: skip
    result = rename_keys(rules, rules.formats["release"], source, expected, {"heads": heads})
    assert not result.problems, result.problems
    fused = np.arange(np.prod(source["attn.qkv.w"])).reshape(source["attn.qkv.w"])
    by_key = {a.target_key: a for a in result.assignments}
    for index, part in enumerate("qkv"):  # rows of head h's part: h * 3 * head_dim + index * head_dim + (0..2)
        rows = [h * 3 * head_dim + index * head_dim + r for h in range(heads) for r in range(head_dim)]
        assert (apply_ops(by_key[f"attn.to_{part}.w"].ops, fused) == fused[rows]).all()
    halves = np.arange(24).reshape(6, 4)
    swapped = apply_ops(by_key["ff.proj"].ops, halves)
    assert (swapped == np.concatenate([halves[3:], halves[:3]])).all()
    assert (apply_ops(inverse_ops(by_key["ff.proj"].ops, (6, 4)), swapped) == halves).all()
    # a config whose head count does not divide the rows: the key is unfit, said
    result = rename_keys(rules, rules.formats["release"], source, expected, {"heads": 4})
    assert any("split into 3 parts of 4 group(s)" in p for p in result.unfit), result.unfit


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (("to: 'attn.to_{part}.{1}'", "to: 'attn.to.{1}'"), "names {part}"),
        (("parts: [q, k, v]", "parts: [q]"), "two or more distinct names"),
        (("order: [1, 0]", "order: [1, 1]"), "permutation"),
    ],
)
def test_a_split_or_reorder_that_cannot_apply_is_refused_when_loading(tmp_path, edit, needle):
    with pytest.raises(MappingError, match=re.escape(needle)):
        _mapping(tmp_path, FUSED.replace(*edit))


def test_a_split_belongs_to_source_formats(tmp_path):
    text = RULES.replace("      transpose: [2, 3, 1, 0]", "      split: {axis: 0, parts: [a, b]}").replace(
        "to: '{1}.kernel'", "to: '{1}.{part}'"
    )
    with pytest.raises(MappingError, match="source-format rules"):
        _mapping(tmp_path, text)


FOLDED = """
family: toy
targets:
  flax: []
source_formats:
  repackaged:
    signature: [conv.weight]
    rules:
      - name: folded
        match: '(conv|up)\\.weight'
        to: '{1}.weight_{part}'
        weight_norm: {dim: 0}
"""


def test_a_folded_weight_norm_becomes_the_g_and_v_that_make_the_same_weight(tmp_path):
    """g is the weight's norm over every axis but dim (torch's norm_except_dim), v the weight: g v / |v| is the
    weight again; a weight norm is a source format's, and has no inverse for export."""
    import numpy as np
    import torch

    from converter.mapping import apply_ops, inverse_ops, rename_keys

    rules = _mapping(tmp_path, FOLDED)
    source = {"conv.weight": (4, 3, 5), "up.weight": (3, 2, 4)}
    expected = {f"{m}.weight_{p}": s if p == "v" else (s[0], 1, 1) for m, s in (("conv", (4, 3, 5)), ("up", (3, 2, 4)))
                for p in "gv"}  # fmt: skip
    result = rename_keys(rules, rules.formats["repackaged"], source, expected, {})
    assert not result.problems, result.problems
    by_key = {a.target_key: a for a in result.assignments}
    weight = np.random.default_rng(0).standard_normal((4, 3, 5)).astype(np.float32)
    g, v = (apply_ops(by_key[f"conv.weight_{p}"].ops, weight) for p in "gv")
    module = torch.nn.utils.weight_norm(torch.nn.Conv1d(3, 4, 5))
    with torch.no_grad():
        module.weight_g.copy_(torch.from_numpy(g))
        module.weight_v.copy_(torch.from_numpy(v))
        module(torch.zeros(1, 3, 5))  # its pre-hook makes the weight of g and v
    assert np.abs(module.weight.detach().numpy() - weight).max() <= 1e-6
    with pytest.raises(ValueError, match="cannot be inverted"):
        inverse_ops(by_key["conv.weight_g"].ops, (4, 3, 5))
    with pytest.raises(MappingError, match="source-format rules"):
        _mapping(tmp_path, RULES.replace("      transpose: [2, 3, 1, 0]", "      weight_norm: {dim: 0}"))
