"""Every failure is a documented exit code with one line: config values of the wrong type or range, option
combinations (with and without --dry-run), a Hub that is offline or unreachable, paths that do not exist. Exit 1 is
for bugs only, and none of these may reach it."""

from __future__ import annotations

import functools
import json
import random
import shutil
import socket

import pytest

from converter.errors import InputError, MappingError, OutputError
from converter.mapping import MAPPINGS_DIR
from tests.helpers import earlier_output, fails, run_cli

# local paths, no signal and no Hub: the CLI runs in the test's process (the Hub's cases start their own)
fails_in_process = functools.partial(fails, in_process=True)

BAD_VALUES = {
    "base_dim": ["16", -16, 0, 1.5, None, True, [16]],
    "dim_mult": [4, [1, "2"], [1, 0], None],
    "z_dim": [None, "4", 0],
    "num_res_blocks": [1.5, -1, "2"],
    "temperal_downsample": [[1, 0, 1], "yes", None],
    "latents_mean": [["a"], 3, [float("inf")]],
    "dropout": ["0", None],
}


def _config_variant(source, folder, key, value):
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("key", list(BAD_VALUES))
def test_config_values_of_the_wrong_type_or_range(wan_small, tmp_path, key):
    source, _ = wan_small
    for i, value in enumerate(BAD_VALUES[key]):
        folder = _config_variant(source, tmp_path / f"v{i}", key, value)
        for dry_run in ([], ["--dry-run"]) if i == 0 else ([],):  # the dry run plans through the same check
            fails_in_process(
                ["wan2.1", "--source", folder, "--to", "flax", "--out", tmp_path / "out", *dry_run],
                InputError.exit_code,
                f"{folder / 'config.json'}: {key} is",  # the file named
                out=tmp_path / "out",
            )


OPTION_POOL = [
    ["--to", "flax"],
    ["--to", "torchax"],
    ["--format", "orbax"],
    ["--format", "safetensors"],
    ["--dtype", "bfloat16"],
    ["--dtype", "float16"],
    ["--revision", "v1"],
    ["--force"],
    ["--offline"],
    ["--no-validate"],
    ["--keep-invalid"],
    ["--allow-nonfinite"],
    ["--mapping", "MAPPING"],
    ["--push-to-hub", "justname"],
    ["--source", "./wan-smal"],
    ["--source", "nobody/x/y"],
    ["--source-format", "wan2.1-original"],
    ["--config", "MAPPING"],
]


@pytest.mark.parametrize("seed", range(6))
def test_option_combinations_never_exit_1(wan_small, tmp_path, seed, monkeypatch):
    """Random option sets, each with and without --dry-run: every outcome is a documented code, never a bug."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    source, _ = wan_small
    rng = random.Random(seed)
    options = [
        part.replace("MAPPING", str(MAPPINGS_DIR / "cogvideox.yaml"))
        for group in rng.sample(OPTION_POOL, rng.randint(1, 5))
        for part in group
    ]
    if "--source" not in options:
        options += ["--source", str(source)]
    for dry_run in ([], ["--dry-run"]):
        result = run_cli("wan2.1", *options, "--out", tmp_path / "out", *dry_run, check=False)
        assert result.returncode in (0, 2, 3, 4, 5, 6), (options, result.stderr)
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr, (options, result.stderr)


def test_typo_in_a_local_path_is_not_taken_for_a_repo(tmp_path):
    fails_in_process(
        ["wan2.1", "--source", "./wan-smal", "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "no such file or folder",
        out=tmp_path / "out",
    )
    (tmp_path / "proj").mkdir()
    fails_in_process(
        ["wan2.1", "--source", "proj/vae", "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "no such file or folder",
        out=tmp_path / "out",
        cwd=tmp_path,
    )


def test_revision_with_a_local_source_is_refused(wan_small, tmp_path):
    source, _ = wan_small
    fails_in_process(
        ["wan2.1", "--source", source, "--revision", "v1", "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "--revision applies to Hub sources",
        out=tmp_path / "out",
    )


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_format_the_target_does_not_have(wan_small, tmp_path, dry_run):
    source, _ = wan_small
    fails_in_process(
        ["wan2.1", "--source", source, "--to", "torchax", "--format", "orbax", "--out", tmp_path / "out", *dry_run],
        InputError.exit_code,
        "--format orbax is not available for --to torchax",
        out=tmp_path / "out",
    )


def test_mapping_of_another_family_is_named(wan_small, tmp_path):
    source, _ = wan_small
    line = fails_in_process(
        [
            "wan2.1",
            "--source",
            source,
            "--to",
            "flax",
            "--mapping",
            MAPPINGS_DIR / "cogvideox.yaml",
            "--out",
            tmp_path / "out",
        ],
        MappingError.exit_code,
        "mapping of the cogvideox family, not of wan",
        out=tmp_path / "out",
    )
    assert len(line) < 300


def test_random_checkpoint_to_an_unwritable_place(tmp_path):
    fails_in_process(
        ["random-checkpoint", "wan2.1", "/proc/vae-convert-test", "--small"],
        OutputError.exit_code,
        "cannot create the output",
    )


def _refusing_port() -> int:
    """A loopback port nothing listens on: connections to it are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
def test_publish_without_the_hub(wan_small, tmp_path, monkeypatch, hub):
    source, _ = wan_small
    monkeypatch.setenv("HF_TOKEN", "write-token")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    if hub == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_refusing_port()}")
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        # a refused connection is retried within the bound (test_hub_faults times that); here only how it ends
        monkeypatch.setenv("VAE_CONVERT_HUB_RETRY_SECONDS", "1")
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    fails(["publish", tmp_path / "out", "me/wan"], OutputError.exit_code, "me/wan")
    fails(
        ["wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out2", "--push-to-hub", "me/wan"],
        OutputError.exit_code,
        "me/wan",
        out=tmp_path / "out2",
    )


@pytest.mark.slow
def test_fetching_without_a_network_says_what_works_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_refusing_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # a refused connection is retried within the bound (test_hub_faults times that); here only how it ends
    monkeypatch.setenv("VAE_CONVERT_HUB_RETRY_SECONDS", "1")
    line = fails(
        ["wan2.1", "--to", "flax", "--out", tmp_path / "out", "--dry-run"], InputError.exit_code, "cannot reach"
    )
    assert "--offline" in line and "--source" in line


def test_publish_checks_the_folder_first_and_names_only_typed_options(wan_small, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    (tmp_path / "not-an-output").mkdir()
    fails(["publish", tmp_path / "not-an-output", "me/wan"], InputError.exit_code, "not a vae-convert output")
    fails(["publish", earlier_output(tmp_path / "damaged"), "me/wan"], InputError.exit_code, "version is missing")
    out = tmp_path / "out"
    run_cli("wan2.1", "--source", wan_small[0], "--to", "torchax", "--out", out, "--no-validate")
    line = fails(["publish", out, "justname"], 2, "ORG/NAME", "'justname'")
    assert "--push-to-hub" not in line


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "soon"])
def test_a_hub_knob_that_bounds_nothing_is_a_usage_error(wan_small, tmp_path, monkeypatch, value):
    """Each Hub knob bounds a wait; NaN and infinity pass a `< 0` test and bound nothing."""
    monkeypatch.setenv("VAE_CONVERT_HUB_TIMEOUT", value)
    fails(
        ["wan2.1", "--to", "flax", "--out", tmp_path / "out"],
        2,
        f"VAE_CONVERT_HUB_TIMEOUT={value!r}: expected a finite positive number",
        out=tmp_path / "out",
        in_process=True,
    )
