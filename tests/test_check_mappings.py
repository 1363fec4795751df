"""`vae-convert check-mappings` on the real mapping (clean) and on broken copies of it, one per error class: each
must exit non-zero and name the offending key or rule with file:line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from converter.cli import cli
from converter.errors import MappingError
from converter.mapping import MAPPINGS_DIR
from converter.registry import FAMILIES, configs_to_check
from tests.helpers import PAIRINGS, REPO

REAL = (MAPPINGS_DIR / "wan.yaml").read_text()


def _check(tmp_path, text, *args):
    path = tmp_path / "wan.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["check-mappings", str(path), *args])
    return path, result


def _line_of(text, needle):
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_real_mappings_are_clean_in_text_and_json():
    result = CliRunner().invoke(cli, ["check-mappings", str(MAPPINGS_DIR / "wan.yaml"), "--target", "torchax"])
    assert result.exit_code == 0, result.output
    assert "all mappings clean" in result.output and "rms-norm-gamma" in result.output
    # every file, every format proven against its pairings: CI's whole check (.ci/run runs no other)
    result = CliRunner().invoke(cli, ["check-mappings", "--json", "--pairings", str(PAIRINGS)])
    report = json.loads(result.output)
    assert report["ok"] and result.exit_code == 0
    formats = [f for m in report["mappings"] for f in m["source_formats"]]
    assert all(f["proven_against"] for f in formats if f["renames"]) and any(f["renames"] for f in formats)
    assert {m["file"].rsplit("/", 1)[1] for m in report["mappings"]} == {f.mapping_file for f in FAMILIES.values()}
    for family in FAMILIES.values():
        rules = next(m for m in report["mappings"] if m["file"].endswith(family.mapping_file))
        for target in rules["targets"]:
            assert {name for name, _ in configs_to_check(family)} <= set(target["configs"])  # a file may map several
            assert all(sum(rule["hits"].values()) > 0 for rule in target["rules"])
    # each distinct VAE once (the Wan 2.1 VAE under its first name), and the extra variants of its test data
    wan = next(m for m in report["mappings"] if m["file"].endswith("wan.yaml"))
    wan_configs = {"wan2.1", "wan2.2", "wan2.1-variant", "wan2.2-variant", "qwen-image", "qwenimage-variant"}
    assert set(wan["targets"][0]["configs"]) == wan_configs  # Qwen-Image's class shares Wan's file


def test_key_matched_by_no_rule(tmp_path):
    broken = re.sub(r"    - name: rms-norm-gamma\n(.*\n){3}", "", REAL, count=1)  # drop the flax gamma rule
    _, result = _check(tmp_path, broken, "--target", "flax")
    assert result.exit_code == MappingError.exit_code
    assert re.search(r"source key 'encoder\.down_blocks\.\d+\.norm1\.gamma' is matched by no rule", result.output)


def test_key_matched_by_two_rules(tmp_path):
    extra = (
        "    - name: duplicate-gamma\n      match: 'decoder\\.norm_out\\.gamma'\n      to: 'decoder.norm_out.gamma'\n"
    )
    broken = REAL.replace("  torchax:\n", extra + "\n  torchax:\n")
    path, result = _check(tmp_path, broken, "--target", "flax")
    assert result.exit_code == MappingError.exit_code
    assert "'decoder.norm_out.gamma' is matched by 2 rules" in result.output
    assert f"duplicate-gamma ({path}:{_line_of(broken, 'duplicate-gamma')})" in result.output
    assert f"rms-norm-gamma ({path}:" in result.output


def test_leaf_unfilled_and_unknown_target(tmp_path):
    broken = REAL.replace("to: '{1}.gamma'", "to: '{1}.scale'")
    _, result = _check(tmp_path, broken, "--target", "flax")
    assert result.exit_code == MappingError.exit_code
    assert "'decoder.norm_out.gamma' is filled by no source key" in result.output
    assert "maps to 'decoder.norm_out.scale'" in result.output


def test_leaf_filled_twice(tmp_path):
    broken = REAL.replace(
        "      match: '(.+\\.resample)\\.1\\.bias'\n      to: '{1}.bias'",
        "      match: '(.+\\.resample)\\.1\\.bias'\n      to: 'decoder.conv_out.bias'",
    )
    assert broken != REAL
    _, result = _check(tmp_path, broken, "--target", "flax")
    assert result.exit_code == MappingError.exit_code
    assert "target leaf 'decoder.conv_out.bias' is filled twice" in result.output


def test_shape_mismatch_names_key_expected_and_got(tmp_path):
    broken = REAL.replace("      transpose: [2, 3, 4, 1, 0]          # (O, I, T, H, W) -> (T, H, W, I, O)\n", "")
    assert broken != REAL
    path, result = _check(tmp_path, broken, "--target", "flax")
    assert result.exit_code == MappingError.exit_code
    line = _line_of(broken, "name: causal-conv3d-kernel")
    assert re.search(
        rf"shape mismatch for 'decoder\.conv_in\.weight' -> 'decoder\.conv_in\.kernel': expected "
        rf"\[3, 3, 3, 16, 384\], got \[384, 16, 3, 3, 3\].*\({re.escape(str(path))}:{line}\)",
        result.output,
    )


def test_dead_rule(tmp_path):
    extra = "    - name: never-used\n      match: 'encoder\\.legacy\\.weight'\n      to: 'encoder.legacy.kernel'\n"
    broken = REAL.replace("  torchax:\n", extra + "\n  torchax:\n")
    path, result = _check(tmp_path, broken, "--target", "flax", "--json")
    assert result.exit_code == MappingError.exit_code
    report = json.loads(result.output)
    assert not report["ok"]
    flax = report["mappings"][0]["targets"][0]
    assert flax["problems"] == [
        f"rule 'never-used' ({path}:{_line_of(broken, 'never-used')}) matches nothing for any registered config"
    ]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.replace("      to: '{1}.kernel'\n", "      to: '{1}.kernel\n", 1), "YAML syntax error"),
        (lambda t: t.replace("transpose: [2, 3, 1, 0]", "tranpose: [2, 3, 1, 0]"), "unknown rule field(s): tranpose"),
        (lambda t: t.replace("reshape: [-1]", "reshape: minus-one"), "reshape takes a list of integers"),
        # templates are filled by str.format: only bare groups, nothing it would run
        (lambda t: t.replace("to: '{1}'", "to: '{1:>99999999}'", 1), "has a format spec or conversion"),
        (lambda t: t.replace("to: '{1}'", "to: '{1.__class__}'", 1), "a template takes the match's groups only"),
        (lambda t: t.replace("to: '{1}'", "to: '{1}{'", 1), "bad 'to' template"),
        (lambda t: t.replace("to: '{1}'", "to: '{9}'", 1), "a template takes the match's groups only"),
        (lambda t: t.replace("transpose: [2, 3, 1, 0]", "transpose: [true, false]", 1), "takes a list of integers"),
        (lambda t: t.replace("- name: causal-conv3d-kernel", "- name: [a, list]", 1), "'name' must be a string"),
        (lambda t: t.replace("model: wan2.1", "model: no-such-model", 1), "not a model name"),
        (lambda t: t.replace("model: wan2.1", "model: [wan2.1]", 1), "not a model name"),
        (lambda t: t.replace("pairings: wan2.1-original.json", "pairings: ../x.json", 1), "must be a file name"),
    ],
)
def test_malformed_file_names_file_and_line(tmp_path, edit, message):
    broken = edit(REAL)
    assert broken != REAL
    path, result = _check(tmp_path, broken)
    assert result.exit_code == MappingError.exit_code
    assert message in result.output
    assert re.search(rf"{re.escape(str(path))}:\d+", result.output)


def _formats(tmp_path, text):
    _, result = _check(tmp_path, text, "--target", "torchax", "--pairings", str(PAIRINGS))
    return result


def test_source_formats_proven_against_the_pairings(tmp_path):
    result = _formats(tmp_path, REAL)
    assert result.exit_code == 0, result.output
    assert "source format wan2.1-original: 194 keys of wan2.1-original.json renamed as listed" in result.output
    assert "source format wan2.2-original: 196 keys of wan2.2-original.json renamed as listed" in result.output
    unproven = CliRunner().invoke(cli, ["check-mappings", str(MAPPINGS_DIR / "wan.yaml"), "--target", "torchax"])
    assert unproven.exit_code == 0 and "not proven (pass --pairings DIR)" in unproven.output


def test_ltx_single_files_proven_against_the_project_s_pairings(tmp_path):
    """LTX's pairings, and a signature key that only a drop rule takes."""
    args = ["check-mappings", str(MAPPINGS_DIR / "ltx.yaml"), "--target", "torchax"]
    result = CliRunner().invoke(cli, [*args, "--pairings", str(PAIRINGS)])
    assert result.exit_code == 0, result.output
    for fmt, pairings, keys in (
        ("ltx-0.9.0", "ltx-0.9.0", 190),
        ("ltx-0.9.1", "ltx-0.9.1", 294),
        ("ltx-0.9.5", "ltx-0.9.5", 226),
        ("ltx-2", "ltx-2.0", 184),
    ):
        assert f"source format {fmt}: {keys} keys of {pairings}.json renamed as listed" in result.output
    # LTX-2's signature holds an audio VAE key, which its pairings (the VAE's keys) do not list: a drop rule takes it;
    # one that nothing takes is a signature no file of the pairings has
    text = (MAPPINGS_DIR / "ltx.yaml").read_text()
    path = tmp_path / "ltx.yaml"
    path.write_text(text.replace("audio_vae.per_channel_statistics.mean-of-means]", "vae.audio_only_key]"))
    broken = CliRunner().invoke(cli, ["check-mappings", str(path), *args[2:], "--pairings", str(PAIRINGS)])
    assert broken.exit_code == MappingError.exit_code
    assert "signature key 'vae.audio_only_key'" in broken.output and "is not a key of ltx-2.0.json nor dropped" in (
        broken.output
    )


def test_wrong_lookup_entry_is_caught_by_the_pairings(tmp_path):
    """Two residual blocks of a level swapped in the lookup: their shapes are equal, so only the pairings tell."""
    broken = REAL.replace("{0: 0.resnets.0, 1: 0.resnets.1,", "{0: 0.resnets.1, 1: 0.resnets.0,")
    assert broken != REAL
    result = _formats(tmp_path, broken)
    assert result.exit_code == MappingError.exit_code
    assert "'decoder.upsamples.0.residual.2.weight' becomes 'decoder.up_blocks.0.resnets.1.conv1.weight'" in (
        result.output
    )
    assert "the pairings say 'decoder.up_blocks.0.resnets.0.conv1.weight'" in result.output


def test_index_missing_from_a_lookup(tmp_path):
    broken = REAL.replace("up_upsampler: {3: 0, 7: 1, 11: 2}", "up_upsampler: {3: 0, 7: 1}")
    result = _formats(tmp_path, broken)
    assert result.exit_code == MappingError.exit_code
    assert "'decoder.upsamples.11.resample.1.weight': n 11 is not in lookup 'up_upsampler'" in result.output


def test_drop_rule_taking_a_model_key(tmp_path):
    greedy = "    drop:\n      - name: greedy\n        match: 'conv2\\..+'\n"
    broken = REAL.replace("  wan2.2-original:\n", greedy + "\n  wan2.2-original:\n")
    result = _formats(tmp_path, broken)
    assert result.exit_code == MappingError.exit_code
    assert "'conv2.weight' is matched by 2 rules (a drop rule would swallow)" in result.output


def test_a_broken_mapping_file_in_the_package_leaves_the_cli_working(tmp_path, wan_small):
    """A copy of the installed package whose cogvideox.yaml has a syntax error: --help works, check-mappings names the
    file and line (exit 4), and a Wan conversion is unaffected (its source-format detection skips that file)."""
    import os
    import shutil
    import subprocess
    import sys

    import converter

    package = tmp_path / "site" / "converter"
    shutil.copytree(Path(converter.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("models", "mappings"):
        if not (package / part).is_dir() or (package / part).is_symlink():
            shutil.rmtree(package / part, ignore_errors=True)
            shutil.copytree(REPO / part, package / part, ignore=shutil.ignore_patterns("__pycache__"))
    broken = package / "mappings" / "cogvideox.yaml"
    lines = broken.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("family:"))
    lines[at] = "family: [cogvideox"  # an unclosed flow sequence
    broken.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "converter", *map(str, args)], capture_output=True, text=True, env=env, cwd=tmp_path
        )

    where = run("--help")
    assert where.returncode == 0 and "Usage" in where.stdout, where.stderr
    checked = run("check-mappings", "--target", "torchax")  # every file, its rules for one target
    assert checked.returncode == MappingError.exit_code
    assert f"{broken}:" in checked.stdout and "YAML syntax error" in checked.stdout, checked.stdout + checked.stderr
    converted = run("wan2.1", "--source", wan_small[0], "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    assert converted.returncode == 0, converted.stderr
    assert json.loads((tmp_path / "out" / "vae_convert.json").read_text())["source"]["format"] == "diffusers"


def test_a_signature_that_fits_another_family_s_checkpoint_is_refused(tmp_path):
    """HunyuanVideo's diffusers signature without its norm key is CogVideoX's too: detection would take a CogVideoX
    checkpoint for HunyuanVideo's layout (HunyuanVideo's arrival once forced an edit to cogvideox.yaml)."""
    text = (MAPPINGS_DIR / "hunyuanvideo.yaml").read_text()
    signature = "decoder.up_blocks.0.resnets.0.conv1.conv.weight, decoder.conv_norm_out.weight]"
    assert signature in text
    path = tmp_path / "hunyuanvideo.yaml"
    path.write_text(text.replace(signature, "decoder.up_blocks.0.resnets.0.conv1.conv.weight]"))
    result = CliRunner().invoke(cli, ["check-mappings", str(path), "--target", "torchax"])
    assert result.exit_code == MappingError.exit_code, result.output
    assert (
        f"{path}:" in result.output and "also fits a checkpoint of AutoencoderKLCogVideoX (cogvideox" in result.output
    )


def test_a_format_that_would_fill_a_weight_is_refused(tmp_path):
    """`filled` gives counts a file lacks the value PyTorch's loader gives them; a weight filled so would validate
    against the same invention. check-mappings refuses it, and so does a conversion."""
    text = (MAPPINGS_DIR / "autoencoderkl.yaml").read_text()
    broken = text.replace(
        "filled: {bn.num_batches_tracked: 0}", "filled: {bn.num_batches_tracked: 0, bn.running_var: 1}"
    )
    assert broken != text
    path = tmp_path / "autoencoderkl.yaml"
    path.write_text(broken)
    result = CliRunner().invoke(cli, ["check-mappings", str(path), "--pairings", str(PAIRINGS)])
    assert result.exit_code == 4 and "'filled' names bn.running_var, which are weights, not counts" in result.output
