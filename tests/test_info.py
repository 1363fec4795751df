"""`vae-convert info DIR` tells what an output holds, from its manifest: as text a person reads (the validation
table as the conversion printed it) and as JSON; a folder that is no output gets one line and exit 3."""

from __future__ import annotations

import json
import shutil

from tests.helpers import fails, manifest, run_cli, run_in_process


def test_info_text_and_json(wan_small, tmp_path):
    source, _ = wan_small
    out = tmp_path / "out"
    converted = run_cli("wan2.1", "--source", source, "--to", "flax", "--format", "safetensors", "--out", out)
    recorded = manifest(out)

    text = run_cli("info", out).stdout
    assert "model:    wan2.1 (family wan)" in text
    assert "target:   flax (safetensors), dtype float32" in text
    assert f"sha256 {recorded['source']['sha256']['diffusion_pytorch_model.safetensors']}" in text
    assert f"mapping:  wan.yaml sha256 {recorded['mapping']['sha256']}" in text
    assert f"tool:     vae-convert {recorded['version']}" in text
    # the validation table reads as the conversion printed it
    table = [line for line in converted.stderr.splitlines() if line.startswith("  ✓ ")]
    assert len(table) == 3 and all(line in text.splitlines() for line in table), (table, text)

    assert json.loads(run_cli("info", out, "--json").stdout) == recorded


def test_info_on_a_folder_that_is_no_output(wan_small, tmp_path):
    source, _ = wan_small
    fails(["info", source], 3, "not a vae-convert output")
    fails(["info", tmp_path / "missing"], 3, "not a vae-convert output")


def test_the_readme_model_table_is_what_list_prints():
    from click.testing import CliRunner

    from converter.cli import cli
    from tests.helpers import REPO

    result = CliRunner().invoke(cli, ["list", "--markdown"])
    assert result.exit_code == 0 and result.output.count("\n") > 3
    assert result.output in (REPO / "README.md").read_text()


def test_info_never_says_passed_above_a_failed_row(wan_small_outputs, tmp_path):
    """A manifest that says ok above a check over its tolerance contradicts itself: the rows decide."""
    out = tmp_path / "out"
    shutil.copytree(wan_small_outputs["flax"], out)
    check = {"output": "decode", "shape": [1, 3, 9, 64, 64], "max_abs": 0.5, "mean_abs": 0.1, "tol": 1e-4, "ok": True}
    record = {**manifest(out), "validation": {"rtol": 1e-4, "ok": True, "checks": [check]}}
    (out / "vae_convert.json").write_text(json.dumps(record))
    result = run_in_process("info", out)
    assert result.returncode == 0, result.stderr
    assert "validation: FAILED (the manifest says passed, but a check is over its tolerance)" in result.stdout
    assert "  ✗ decode" in result.stdout and "validation: passed" not in result.stdout
