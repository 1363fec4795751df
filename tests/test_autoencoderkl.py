"""The image VAEs of SD, SDXL, SD3, Flux.1 and Flux.2 beyond the generic tests (which take their small configs, image
sizes, tiling case, meshes and original single files from models/autoencoderkl/testing.py): a checkpoint saved with
diffusers' old attention names converts to the tensors diffusers itself loads from it; the VAE inside a whole SD or
SD3 checkpoint converts, the rest named and dropped; an LDM file of any depth converts as diffusers' converter
converts it; a file with no config converts as what its tensors say, and they say every published config back; a
VAE kept at the top of its Hub repo (sdxl-vae-fp16-fix) is fetched alone; Flux.2's BatchNorm statistics are carried
exactly and normalise latents as Flux.2's pipelines do; BFL's Flux.2 file named as Flux.1 is refused with the right
command."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import diffusers
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import converter
from converter.registry import FAMILIES, MODELS
from converter.targets import diffusers_shapes
from tests.fake_hub import Repo
from tests.helpers import DATA, fails, manifest, run_cli, run_in_process, save_diffusers, small
from tests.original_files import as_released, assert_same_tensors, output_tensors

KL, FLUX2 = FAMILIES["autoencoderkl"], FAMILIES["flux2"]
LEGACY = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A small SD-layout checkpoint saved by diffusers."""
    folder = tmp_path_factory.mktemp("kl") / "vae"
    save_diffusers(KL, folder, small(KL, "default-arch")[1])
    return folder


def test_legacy_attention_names_convert_to_what_diffusers_loads(checkpoint, tmp_path):
    """query/key/value/proj_attn, as diffusers saved them before 0.14: converted with the model name alone (no
    --source-format), the torchax output holds exactly the tensors diffusers loads from the file."""
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_bytes((checkpoint / "config.json").read_bytes())
    state = load_file(checkpoint / "diffusion_pytorch_model.safetensors")
    renamed = {}
    for key, value in state.items():
        for new, old in LEGACY.items():
            key = key.replace(f".attentions.0.{new}.", f".attentions.0.{old}.")
        renamed[key] = value
    assert renamed.keys() != state.keys()
    save_file(renamed, legacy / "diffusion_pytorch_model.safetensors")
    # the oracle: diffusers' own loader renames the old names as it reads them
    loaded = diffusers.AutoencoderKL.from_pretrained(legacy).state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    name, _ = small(KL, "default-arch")
    run_cli(name, "--source", legacy, "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    assert "layout:   diffusers-legacy-attention" in run_cli("info", tmp_path / "out").stdout
    got = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    assert got.keys() == loaded.keys() and all(torch.equal(got[k], loaded[k]) for k in loaded)


@pytest.mark.parametrize(
    ("fmt", "which", "file_name"),
    [
        ("ldm-checkpoint", "default-arch", "v1-5-pruned-emaonly.ckpt"),
        ("sd3-checkpoint", "sd3-layout", "sd3.safetensors"),
        ("ldm-checkpoint-vae-prefix", "default-arch", "sdxl-merged.safetensors"),
    ],
)
def test_the_vae_of_a_whole_checkpoint_converts_and_the_rest_is_dropped(tmp_path, fmt, which, file_name):
    """v1-5-pruned-emaonly.ckpt (its tensors under `state_dict`, beside the training step), sd3_medium.safetensors,
    a checkpoint keeping its VAE under vae.: the VAE beside the UNet or transformer and the text encoders, which are
    counted by the drop rule that takes them."""
    name, config = small(KL, which)
    config = {**config, **KL.testing().original_files["ldm"].config_changes}
    state = save_diffusers(KL, tmp_path / "diffusers", config).state_dict()
    others = {
        "model.diffusion_model.input_blocks.0.0.weight": torch.zeros(8, 4, 3, 3),
        "conditioner.embedders.0.transformer.text_model.embeddings.token_embedding.weight": torch.zeros(16, 8),
    }
    whole, tensors = tmp_path / file_name, {**as_released(state, fmt, KL), **others}
    if whole.suffix == ".ckpt":
        torch.save({"state_dict": tensors, "global_step": 840000}, whole)
    else:
        save_file(tensors, whole)
    config_file = tmp_path / "diffusers" / "config.json"
    # not validated: the tensors are compared with those of diffusers' own checkpoint
    result = run_cli(
        name, "--source", whole, "--config", config_file, "--to", "flax", "--out", tmp_path / "o", "--no-validate"
    )
    run_in_process(
        name, "--source", tmp_path / "diffusers", "--to", "flax", "--out", tmp_path / "d", "--no-validate", check=True
    )
    assert_same_tensors(output_tensors(tmp_path / "o"), output_tensors(tmp_path / "d"))
    info = manifest(tmp_path / "o")
    assert info["source"]["format"] == fmt
    assert info["source"]["dropped"] == {"not-the-vae": {"tensors": 2, "bytes": 4 * (8 * 4 * 9 + 16 * 8)}}
    assert "dropped 2 tensor(s) by rule not-the-vae" in result.stderr


def _ldm_key(key: str, levels: int) -> str:
    """The LDM name of a diffusers key, as the pairings' script writes it (tests/data/source-formats/)."""
    import importlib.util

    path = DATA / "source-formats" / "make_autoencoderkl_pairings.py"
    spec = importlib.util.spec_from_file_location("make_autoencoderkl_pairings", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script.ldm_key(key, levels)


@pytest.mark.parametrize("widths", [(32, 64, 64), (32, 32, 64, 64, 64)], ids=["3-levels", "5-levels"])
def test_an_ldm_file_of_any_depth_converts_as_diffusers_converts_it(tmp_path, widths):
    """The LDM decoder numbers its levels from the top: a kl-f4 (3 levels) or 5-level VAE file, with no config, converts
    to the tensors diffusers' own convert_ldm_vae_checkpoint makes of it, its depth read from the tensors."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    n = len(widths)
    config = dict(small(KL, "default-arch")[1], block_out_channels=list(widths), norm_num_groups=32)
    config.update(down_block_types=["DownEncoderBlock2D"] * n, up_block_types=["UpDecoderBlock2D"] * n)
    state = save_diffusers(KL, tmp_path / "diffusers", config).state_dict()
    released = {
        _ldm_key(k, n): v.reshape(*v.shape, 1, 1) if ".attentions.0.to_" in k and k.endswith("weight") else v
        for k, v in state.items()
    }
    oracle = convert_ldm_vae_checkpoint(released, config)
    assert oracle.keys() == state.keys() and all(torch.equal(oracle[k], state[k]) for k in state)
    save_file({k: v.contiguous() for k, v in released.items()}, tmp_path / "vae.safetensors")
    args = ("--to", "torchax", "--out", tmp_path / "o", "--no-validate")  # the tensors are compared
    result = run_cli("sd1.5", "--source", tmp_path / "vae.safetensors", *args)
    assert "block_out_channels" in result.stderr  # inferred from the tensors, said
    got = load_file(tmp_path / "o" / "diffusion_pytorch_model.safetensors")
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)


def test_a_vae_at_the_top_of_its_hub_repo_is_fetched_alone(hub, checkpoint, tmp_path):
    """sdxl-vae-fp16-fix keeps diffusers' files at the repo's top, beside single-file copies of the same VAE that a
    conversion must not fetch."""
    repo = "madebyollin/sdxl-vae-fp16-fix"
    files = {p.name: p.read_bytes() for p in checkpoint.iterdir()}
    hub.repos[repo] = Repo({**files, "sdxl.vae.safetensors": b"\0" * 4096, "sdxl_vae.safetensors": b"\0" * 4096})
    run_cli("sdxl-fp16-fix", "--to", "flax", "--out", tmp_path / "out", "--no-validate")
    fetched = {path.split("/resolve/", 1)[1].split("/", 1)[1] for path in hub.downloads()}
    assert fetched == {"config.json", "diffusion_pytorch_model.safetensors"}


# what no tensor shows: from the model name
NOT_IN_TENSORS = (
    *("norm_num_groups", "sample_size", "scaling_factor", "shift_factor", "force_upcast", "act_fn"),
    *("batch_norm_eps", "batch_norm_momentum"),
)


PUBLISHED = {
    **{
        p.name.split(".vae")[0]: json.loads(p.read_text())
        for p in sorted((DATA / "configs").glob("*.json"))
        if json.loads(p.read_text())["_class_name"] in (KL.class_name, FLUX2.class_name)
    },
    # published as a class default with other decoder widths, not as a file kept here
    "flux.2-small-decoder": {"_class_name": FLUX2.class_name, **MODELS["flux.2-small-decoder"].config},
}


@pytest.mark.parametrize("raw", PUBLISHED.values(), ids=PUBLISHED)
def test_the_tensors_of_every_published_config_give_it_back(raw):
    family = FLUX2 if raw["_class_name"] == FLUX2.class_name else KL
    published = family.config_class.from_dict(raw)
    named = {k: v for k, v in raw.items() if k in NOT_IN_TENSORS}
    inferred = family.config_from_shapes(diffusers_shapes(family, published), named)
    assert family.config_class.from_dict(inferred) == published


def test_a_file_without_config_converts_as_its_tensors_say(tmp_path):
    """An SD-layout VAE of other widths and depth than SD 1.5's, its weights alone, named sd1.5: converted and
    validated as what it is, with the inference said and recorded; SD 1.5's norm groups and scaling kept."""
    config = dict(MODELS["sd1.5"].config, block_out_channels=[32, 64], down_block_types=["DownEncoderBlock2D"] * 2)
    config.update(up_block_types=["UpDecoderBlock2D"] * 2, layers_per_block=1, latent_channels=8)
    save_diffusers(KL, tmp_path / "vae", config)
    bare = tmp_path / "alone" / "vae.safetensors"
    bare.parent.mkdir()
    bare.write_bytes((tmp_path / "vae" / "diffusion_pytorch_model.safetensors").read_bytes())
    result = run_cli("sd1.5", "--source", bare, "--to", "flax", "--out", tmp_path / "out")
    inferred = ["block_out_channels", "down_block_types", "latent_channels", "layers_per_block", "up_block_types"]
    assert f"config: {', '.join(inferred)} inferred from the tensors" in result.stderr
    info = manifest(tmp_path / "out")
    assert info["validation"]["ok"] and info["source"]["config_inferred"] == inferred
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == KL.config_class.from_dict(config).to_dict()


# Flux.2's structure (four levels of two layers, norm groups of 32) at small widths and 8 latent channels: what BFL's
# file of it holds, the released key names, and what a Flux.2 name's config cannot say
FLUX2_RELEASED = dict(MODELS["flux.2-dev"].config, block_out_channels=[32, 64, 96, 96], latent_channels=8)


@pytest.fixture(scope="module")
def flux2_outputs(tmp_path_factory):
    """A small Flux.2 checkpoint saved by diffusers (its BatchNorm statistics and count of batches perturbed) and
    its conversions to both targets; and BFL's file of a Flux.2 VAE of small widths."""
    root = tmp_path_factory.mktemp("flux2")
    name, config = small(FLUX2, "default-arch")
    save_diffusers(FLUX2, root / "vae", config)
    for target in ("flax", "torchax"):
        run_in_process(
            name, "--source", root / "vae", "--to", target, "--out", root / target, "--no-validate", check=True
        )
    state = save_diffusers(FLUX2, root / "released", FLUX2_RELEASED).state_dict()
    save_file({k: v.contiguous() for k, v in as_released(state, "bfl-flux2", FLUX2).items()}, root / "ae.safetensors")
    return root


def test_batch_norm_statistics_are_exact_and_normalise_as_flux2_pipelines_do(flux2_outputs):
    reference = diffusers.AutoencoderKLFlux2.from_pretrained(flux2_outputs / "vae").eval()
    statistics = {k: v for k, v in reference.state_dict().items() if k.startswith("bn.")}
    assert statistics["bn.num_batches_tracked"].dtype == torch.int64 and statistics["bn.num_batches_tracked"] > 0
    read = diffusers.AutoencoderKLFlux2.from_pretrained(flux2_outputs / "torchax").state_dict()
    assert all(read[k].dtype == v.dtype and torch.equal(read[k], v) for k, v in statistics.items())
    flax = converter.load(flux2_outputs / "flax")
    for key, value in statistics.items():
        carried = np.asarray(getattr(flax.bn, key.removeprefix("bn."))[...])
        assert np.array_equal(carried, value.numpy()), key
    recorded = manifest(flux2_outputs / "flax")["tensors"]
    assert recorded["bn.running_mean"] == statistics["bn.running_mean"].tolist()

    # the pipelines' own patchify, then their normalisation with the statistics
    z = torch.randn(2, 8, 6, 10, generator=torch.Generator().manual_seed(0))
    patched = _flux2_pipeline_patchify()(z)
    mean = statistics["bn.running_mean"].view(1, -1, 1, 1)
    std = torch.sqrt(statistics["bn.running_var"].view(1, -1, 1, 1) + reference.config.batch_norm_eps)
    expected = ((patched - mean) / std).numpy()
    got = np.moveaxis(np.asarray(flax.bn(np.moveaxis(patched.numpy(), 1, -1))), -1, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        np.testing.assert_allclose(converter.load(flux2_outputs / "torchax").bn(patched).numpy(), expected, atol=1e-6)


def _flux2_pipeline_patchify():
    """`Flux2Pipeline._patchify_latents` from diffusers' source: the pipeline's module imports transformers, which
    the tests do not install, so the method is compiled on its own."""
    source = Path(diffusers.__file__).parent / "pipelines" / "flux2" / "pipeline_flux2.py"
    pipeline = next(n for n in ast.parse(source.read_text()).body if getattr(n, "name", None) == "Flux2Pipeline")
    method = next(n for n in pipeline.body if getattr(n, "name", None) == "_patchify_latents")
    method.decorator_list = []  # a staticmethod in the class; a plain function here
    namespace = {}
    exec(compile(ast.Module([method], type_ignores=[]), str(source), "exec"), namespace)
    return namespace["_patchify_latents"]


def test_a_bfl_flux2_file_named_as_flux1_is_refused_with_its_command(flux2_outputs, tmp_path):
    """BFL's files carry no config: their keys tell Flux.2's (quant convs inside the coders, bn) from Flux.1's."""
    out = tmp_path / "o"
    args = ["flux.1-dev", "--source", flux2_outputs / "ae.safetensors", "--to", "flax", "--out", out]
    fails(args, 3, "is a checkpoint of AutoencoderKLFlux2 (bfl-flux2", "try `vae-convert flux.2-dev`", out=out)


def test_a_bfl_flux2_file_without_config_converts_as_its_tensors_say(flux2_outputs, tmp_path):
    """BFL's Flux.2 file of other widths than Flux.2's, alone: the config inferred from its tensors, the count of
    batches it lacks filled as diffusers' loader fills it, said and recorded, validated."""
    bfl = flux2_outputs / "ae.safetensors"
    result = run_cli("flux.2-dev", "--source", bfl, "--to", "torchax", "--out", tmp_path / "out")
    assert "bn.num_batches_tracked filled with 0, as diffusers' loader gives it" in result.stderr
    info = manifest(tmp_path / "out")
    assert info["validation"]["ok"] and info["source"]["filled"] == {"bn.num_batches_tracked": 0}
    assert info["source"]["config_inferred"] == ["block_out_channels", "latent_channels"]
    shown = run_cli("info", tmp_path / "out").stdout
    assert "filled:   bn.num_batches_tracked = 0" in shown
    assert "config:   block_out_channels, latent_channels read from the tensors" in shown
    expected = FLUX2.config_class.from_dict(FLUX2_RELEASED).to_dict()
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == expected
    converted = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    state = load_file(flux2_outputs / "released" / "diffusion_pytorch_model.safetensors")
    assert converted["bn.num_batches_tracked"].dtype == torch.int64 and converted["bn.num_batches_tracked"] == 0
    assert all(torch.equal(converted[k], v) for k, v in state.items() if k != "bn.num_batches_tracked")


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8])
def test_a_whole_checkpoint_with_a_quantized_transformer_converts_its_vae(tmp_path, dtype):
    """All-in-one files keep an fp8 or 8-bit transformer beside a float VAE: every safetensors dtype is read, and
    only the tensors converted are judged by theirs."""
    name, config = small(KL, "default-arch")
    config = {**config, **KL.testing().original_files["ldm"].config_changes}
    state = save_diffusers(KL, tmp_path / "diffusers", config).state_dict()
    vae = as_released(state, "ldm-checkpoint", KL)
    save_file({**vae, "model.diffusion_model.x.weight": torch.zeros(4, 4, dtype=dtype)}, tmp_path / "all.safetensors")
    args = (
        "--config",
        tmp_path / "diffusers" / "config.json",
        "--to",
        "flax",
        "--out",
        tmp_path / "o",
        "--no-validate",
    )
    run_cli(name, "--source", tmp_path / "all.safetensors", *args)
    assert manifest(tmp_path / "o")["source"]["dropped"]["not-the-vae"]["tensors"] == 1


def test_a_config_and_weights_of_two_models_are_refused_without_a_command_that_loops(flux2_outputs, tmp_path):
    """Flux.2's weights under an AutoencoderKL config.json: the keys name one class, the config the other. Each
    model name once sent the user to the other; now the named one says the folder holds two models."""
    folder = tmp_path / "mixed"
    shutil.copytree(flux2_outputs / "vae", folder)
    config = json.loads((folder / "config.json").read_text())
    config = {k: v for k, v in config.items() if k in KL.config_class.__dataclass_fields__}
    (folder / "config.json").write_text(json.dumps({**config, "_class_name": "AutoencoderKL"}))
    out = tmp_path / "o"
    error = fails(["sd1.5", "--source", folder, "--to", "flax", "--out", out], 3, "of two models", out=out)
    assert "vae-convert" not in error


def test_an_image_smaller_than_the_downsamplers_take_is_one_clear_error(default_arch):
    """diffusers fails on a kernel larger than the input; here the models say the size they need."""
    converted = default_arch(KL)
    ratio = KL.config_class.from_dict(dict(converted.reference.config)).spatial_ratio
    flax_model, torch_model = (converter.load(converted.outputs[t]) for t in ("flax", "torchax"))
    with pytest.raises(ValueError, match=f"at least {ratio}x{ratio} pixels"):
        flax_model.encode(np.zeros((1, 1, 3, 3), np.float32))
    with pytest.raises(ValueError, match=f"at least {ratio}x{ratio} pixels"):
        torch_model.encode(torch.zeros(1, 3, ratio - 1, 8))
