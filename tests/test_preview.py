"""validation.png: written by every validated conversion (unless --no-preview), with the panels the layout promises,
frames drawn from the test clip, heat maps on their colour scale, the decode heat map's max equal to the report's,
and embedded in the model card."""

from __future__ import annotations

import wave

import numpy as np
import pytest
from PIL import Image

from converter import preview
from converter.models.wan.config import WanVAEConfig
from converter.publish import model_card
from converter.registry import FAMILIES
from converter.validate import validation_clip
from tests.helpers import manifest, run_cli

WAN = FAMILIES["wan"]


@pytest.fixture(scope="module")
def converted(wan_small, tmp_path_factory):
    source, _ = wan_small
    out = tmp_path_factory.mktemp("preview") / "out"
    run_cli("wan2.1", "--source", source, "--to", "flax", "--out", out)
    return source, out


def test_picture_has_the_panels_and_the_report_max(converted):
    source, out = converted
    image = Image.open(out / "validation.png")
    config = WanVAEConfig.from_dict(WAN.testing().small_configs["default-arch"])
    clip = validation_clip(WAN.validation_sample_shape(config))  # (1, 3, 5, 64, 64)
    decoded_frames = 9  # the validation latent's 3 frames decode to 9
    layout = preview.Layout(len(preview.frame_indices(5)), len(preview.frame_indices(decoded_frames)))
    assert image.size == layout.size
    pixels = np.asarray(image.convert("RGB"))

    # the input row is the test clip, each source pixel a square block (64 px frames scaled 2x into 128 px tiles)
    scale = preview.TILE // 64
    for column, t in enumerate(preview.frame_indices(5)):
        x, y = layout.tile("reconstruction", 0, column)
        expected = preview.to_rgb(clip[0, :, t])
        for sy, sx in ((3, 5), (40, 40), (60, 2)):
            assert tuple(pixels[y + sy * scale + scale - 1, x + sx * scale]) == tuple(expected[sy, sx])

    # colour bars run from the scale's zero to its top; each heat map's hottest pixel is the top of the scale
    columns = {"reconstruction": layout.reconstruction_frames, "decode": layout.decode_frames}
    for section, row in (("reconstruction", 3), ("decode", 2)):
        left, top, right, _ = layout.colour_bar(section)
        assert tuple(pixels[top + 2, left]) == tuple(preview.heat_colours(np.array(0.0)))
        assert tuple(pixels[top + 2, right - 1]) == tuple(preview.heat_colours(np.array(1.0)))
        corners = [layout.tile(section, row, column) for column in range(columns[section])]
        heat = np.concatenate([pixels[y : y + preview.TILE, x : x + preview.TILE].reshape(-1, 3) for x, y in corners])
        hottest = heat[heat.astype(int).sum(axis=1).argmax()]
        assert tuple(hottest) == tuple(preview.heat_colours(np.array(1.0)))

    recorded = manifest(out)["validation"]
    decode = next(c for c in recorded["checks"] if c["output"] == "decode")
    assert float(image.text[preview.HEAT_TEXT_KEYS["decode"]]) == decode["max_abs"]
    assert recorded["preview"]["max_abs"]["decode"] == decode["max_abs"]
    card = model_card(manifest(out), "me/wan-flax")
    assert "](validation.png)" in card


@pytest.mark.slow
def test_no_preview(wan_small, tmp_path):
    source, _ = wan_small
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out", "--no-preview")
    assert not (tmp_path / "out" / "validation.png").exists()
    assert "preview" not in manifest(tmp_path / "out")["validation"]
    assert "](validation.png)" not in model_card(manifest(tmp_path / "out"), "me/wan-tx")


def test_heat_map_shows_the_frame_of_its_max(tmp_path):
    """Of 9 decoded frames the picture shows 5; the one holding the largest difference is among them, whichever."""
    clip = np.zeros((1, 3, 5, 16, 16), np.float32)
    expected = np.zeros((1, 3, 9, 16, 16), np.float32)
    layout = preview.Layout(len(preview.frame_indices(5)), len(preview.frame_indices(9)))
    tiles = [layout.tile("decode", 2, column) for column in range(layout.decode_frames)]
    for hottest in range(9):
        got = expected + 0.1
        got[0, 1, hottest, 7, 9] = 0.5
        path = tmp_path / f"{hottest}.png"
        preview.write(path, clip, (clip, clip), (got, expected))
        pixels = np.asarray(Image.open(path).convert("RGB"))
        heat = np.concatenate([pixels[y : y + preview.TILE, x : x + preview.TILE].reshape(-1, 3) for x, y in tiles])
        assert (heat == preview.heat_colours(np.array(1.0))).all(axis=1).any(), hottest


def test_rgba_frames_are_shown_over_a_checkerboard():
    """Qwen-Image 2.1 and Qwen-Image-Layered decode RGBA: an opaque pixel shows its colour, a transparent one the
    checkerboard behind it, so a wrong alpha channel shows."""
    frame = np.full((4, 16, 16), -1.0)
    frame[0] = 1.0  # red where opaque
    frame[3, :, :8] = 1.0  # the left half opaque, the right half transparent
    rgb = preview.to_rgb(frame)
    assert (rgb[:, :8] == (255, 0, 0)).all()
    checkerboard = {tuple(rgb[0, 8]), tuple(rgb[8, 8])}
    assert checkerboard == {(204, 204, 204), (153, 153, 153)}
    assert (preview.to_rgb(frame[:3]) == rgb[0, 0]).all()  # RGB alone: the colour everywhere


def test_frames_larger_than_a_tile_are_shrunk_to_fit_it():
    """A test image of 256 pixels (6 levels, or Qwen-Image 2.1's 16x) is drawn in its tile, not over its
    neighbours: frames are shrunk as small ones are enlarged."""
    from PIL import Image

    from converter import preview

    for side, drawn in ((16, preview.TILE), (256, preview.TILE), (300, preview.TILE)):
        assert max(preview._scaled(Image.new("RGB", (side, side // 2))).size) <= drawn
    assert preview._scaled(Image.new("RGB", (256, 256))).size == (preview.TILE, preview.TILE)


# the first family whose decode is a sound (a vocoder)
SOUNDING = next(f for f in FAMILIES.values() if f.sample_rate is not None)


def test_a_waveform_is_drawn_and_written_as_sound(tmp_path):
    """A vocoder's validation draws each channel's waveform by both models and their difference, whose scale's max is
    the report's; validation.wav holds the converted decode at the config's sample rate, which diffusers' model
    gives on the validation mel to within a 16-bit step."""
    import torch

    from converter.validate import validation_inputs
    from tests.helpers import save_diffusers, small

    name, config = small(SOUNDING, "default-arch")
    model = save_diffusers(SOUNDING, tmp_path / "vae", config)
    out = tmp_path / "out"
    result = run_cli(name, "--source", tmp_path / "vae", "--to", "torchax", "--out", out)
    assert "sound: validation.wav" in result.stderr
    recorded = manifest(out)["validation"]
    assert recorded["preview"]["sound"] == preview.SOUND_FILE_NAME
    decode = next(c for c in recorded["checks"] if c["output"] == "decode")
    image = Image.open(out / preview.FILE_NAME)
    assert (
        float(image.text[preview.HEAT_TEXT_KEYS["decode"]])
        == decode["max_abs"]
        == recorded["preview"]["max_abs"]["decode"]
    )
    parsed = SOUNDING.config_class.from_dict(config)
    mel, _ = validation_inputs(SOUNDING, parsed)
    with torch.no_grad():
        expected = model(torch.from_numpy(mel)).numpy()[0]  # (channels, samples)
    with wave.open(str(out / preview.SOUND_FILE_NAME)) as sound:
        assert (sound.getnchannels(), sound.getframerate()) == (expected.shape[0], SOUNDING.sample_rate(parsed))
        samples = np.frombuffer(sound.readframes(sound.getnframes()), "<i2").reshape(-1, expected.shape[0]).T
    assert samples.shape == expected.shape and np.abs(expected).max() > 0.01
    assert np.abs(samples / 32767 - expected).max() <= 1 / 32767 + 1e-4


def test_a_waveform_plot_spans_each_column_s_samples(tmp_path):
    """Each pixel column of a channel's band spans the range of the samples under it; the difference row's hottest
    column is where the largest difference lies."""
    samples = preview.WAVE_WIDTH * 3
    expected = np.zeros((2, samples))
    expected[1] = np.linspace(-1, 1, samples)  # the second channel a ramp: low at the left, high at the right
    got = expected.copy()
    got[0, samples // 4] = 0.5
    maxima = preview.write(tmp_path / "p.png", None, None, (got[None], expected[None]))
    assert maxima == {"decode": 0.5}
    pixels = np.asarray(Image.open(tmp_path / "p.png").convert("RGB"))[:, preview.LABEL_WIDTH :]
    band = preview.TILE // 2
    drawn = (pixels == preview.WAVE_COLOUR).all(axis=-1)
    reference = drawn[preview.TITLE_HEIGHT + preview.TILE + preview.GAP :][:, : preview.WAVE_WIDTH]
    assert reference[band // 2, 10] and not reference[: band // 2 - 1, 10].any()  # silence: the band's middle
    ramp = reference[band : 2 * band]
    assert ramp[-1, 0] and ramp[0, -1] and not ramp[0, 0]  # the ramp rises from the bottom left to the top right
    heat = pixels[preview.TITLE_HEIGHT + 2 * (preview.TILE + preview.GAP) :][:band, : preview.WAVE_WIDTH]
    hottest = (heat == preview.heat_colours(np.array(1.0))).all(axis=-1).any(axis=0)
    assert hottest.nonzero()[0].tolist() == [preview.WAVE_WIDTH // 4]
