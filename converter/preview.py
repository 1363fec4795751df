"""validation.png: a picture of every validation. The report's numbers say the conversion is right; the picture shows
what the converted model does beside the model it was checked against, and where the two differ:

  reconstruction   the validation's test clip (validate.validation_clip: moving shapes, colour gradients, fine
                   high-contrast stripes), encoded and decoded by each model: rows input, converted, reference,
                   |converted - reference|
  latent decode    the validation's fixed latent decoded by each: rows converted, reference, |converted - reference|
  waveform         a model that decodes to sound (a vocoder, an audio VAE): the same sections as waveforms, each
                   channel's by each model (the range of the samples under every pixel column) and
                   |converted - reference| under them; validation.wav beside it is the converted model's decode,
                   to listen to

Each heat map has its colour scale and its max written beside it; the PNG also carries those maxima as text chunks.
With random weights the frames are noise, with real weights reconstructions; the heat maps show the conversion
either way.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

FILE_NAME = "validation.png"
SOUND_FILE_NAME = "validation.wav"
TILE = 128  # every frame is scaled (nearest neighbour) to fit a TILE x TILE square
GAP = 4
LABEL_WIDTH = 150
TITLE_HEIGHT = 22
SCALE_HEIGHT = 30  # the colour bar under each heat map row
MAX_FRAMES = 5
WAVE_WIDTH = 4 * TILE  # a waveform's plot, its channels one under another in a tile's height
WAVE_COLOUR = (40, 40, 160)
CHECK = 8  # the side of the checkerboard squares behind a transparent pixel, in frame pixels
BACKGROUND = (255, 255, 255)
# black -> purple -> orange -> light yellow: |Δ| from 0 to the section's max
HEAT_ANCHORS = np.array([[0, 0, 4], [120, 28, 109], [237, 105, 37], [252, 255, 164]], dtype=np.float64)
HEAT_TEXT_KEYS = {"reconstruction": "reconstruction max |diff|", "decode": "decode max |diff|"}


def heat_colours(levels: np.ndarray) -> np.ndarray:
    """levels in [0, 1] -> uint8 RGB along HEAT_ANCHORS."""
    points = np.linspace(0.0, 1.0, len(HEAT_ANCHORS))
    rgb = [np.interp(levels, points, HEAT_ANCHORS[:, c]) for c in range(3)]
    return np.clip(np.rint(np.stack(rgb, axis=-1)), 0, 255).astype(np.uint8)


def to_rgb(frame: np.ndarray) -> np.ndarray:
    """(C, H, W) in [-1, 1] -> (H, W, 3) uint8: RGB; RGBA over a grey checkerboard, as image viewers show
    transparency; one channel grey; otherwise the first three channels."""
    channels = frame[:3] if frame.shape[0] >= 3 else np.repeat(frame[:1], 3, axis=0)
    rgb = (channels.transpose(1, 2, 0) + 1.0) / 2.0
    if frame.shape[0] == 4:
        alpha = np.clip((frame[3] + 1.0) / 2.0, 0.0, 1.0)[..., None]
        rows, columns = np.indices(frame.shape[1:])
        checks = np.where((rows // CHECK + columns // CHECK) % 2, 0.6, 0.8)[..., None]
        rgb = rgb * alpha + checks * (1.0 - alpha)
    return np.clip(np.rint(rgb * 255.0), 0, 255).astype(np.uint8)


def frame_indices(frames: int, hottest: int | None = None) -> list[int]:
    """At most MAX_FRAMES frames, evenly spread, first and last included; with `hottest` (a heat map's frame holding
    its max), the inner frame nearest it gives way to it, so the picture shows the largest difference it names."""
    spread = sorted({int(round(i)) for i in np.linspace(0, frames - 1, min(frames, MAX_FRAMES))})
    if hottest is None or hottest in spread:
        return spread
    nearest = min(spread[1:-1], key=lambda t: abs(t - hottest))
    return sorted(set(spread) - {nearest} | {hottest})


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each panel lies: sections stacked, each a title, rows of frame tiles and, under its heat map row, a
    colour bar with its scale."""

    reconstruction_frames: int
    decode_frames: int

    def section_height(self, rows: int) -> int:
        return TITLE_HEIGHT + rows * (TILE + GAP) + SCALE_HEIGHT + GAP

    @property
    def decode_top(self) -> int:
        """Where the decode section starts: under the reconstruction's, where the model has an encoder."""
        return self.section_height(4) if self.reconstruction_frames else 0

    @property
    def size(self) -> tuple[int, int]:
        columns = max(self.reconstruction_frames, self.decode_frames, 2)  # the colour bar spans two tiles
        return LABEL_WIDTH + columns * (TILE + GAP), self.decode_top + self.section_height(3)

    def tile(self, section: str, row: int, column: int) -> tuple[int, int]:
        """The top-left corner of a frame tile: section "reconstruction" (rows input, converted, reference, heat map)
        or "decode" (rows converted, reference, heat map)."""
        top = 0 if section == "reconstruction" else self.decode_top
        return LABEL_WIDTH + column * (TILE + GAP), top + TITLE_HEIGHT + row * (TILE + GAP)

    def colour_bar(self, section: str) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) of a section's colour bar."""
        rows = 4 if section == "reconstruction" else 3
        top = (0 if section == "reconstruction" else self.decode_top) + TITLE_HEIGHT + rows * (TILE + GAP)
        return LABEL_WIDTH, top, LABEL_WIDTH + 2 * TILE, top + 10


def write(path: Path, clip: np.ndarray | None, reconstructions: tuple | None, decoded: tuple) -> dict:
    """Draws validation.png at `path` from channels-first videos (or images, drawn as one-frame videos; waveforms,
    each channel folded into rows of pixels): the test clip, its reconstruction by the converted model and by the
    reference (a model without an encoder has none: clip and reconstructions None), and the validation latent's
    decode by each (as the report compared them); waveforms (B, C, N) as plots. Returns the heat maps' maxima."""
    if decoded[0].ndim == 3:
        return _draw_waveforms(path, clip, reconstructions, decoded)
    decoded = tuple(map(_as_video, decoded))
    sections = {}
    frames = 0
    if clip is not None:
        clip, reconstructions = _as_video(clip), tuple(map(_as_video, reconstructions))
        frames = min(clip.shape[2], *(r.shape[2] for r in reconstructions))
        sections["reconstruction"] = [clip[0, :, :frames]] + [r[0, :, :frames] for r in reconstructions]
    sections["decode"] = [decoded[0][0], decoded[1][0]]
    layout = Layout(len(frame_indices(frames)) if frames else 0, len(frame_indices(decoded[0].shape[2])))
    return _draw(path, layout, sections)


def _as_video(x: np.ndarray) -> np.ndarray:
    """(B, C, H, W) images as one-frame videos (B, C, 1, H, W); videos as they are."""
    return x[:, :, None] if x.ndim == 4 else x


def _draw_waveforms(path: Path, clip, reconstructions, decoded: tuple) -> dict:
    """Sections of (C, N) waveforms in [-1, 1]: the test waveform's reconstruction (rows input, converted, reference,
    |difference|; a model without an encoder has none) and the decode (rows converted, reference, |difference|)."""
    from PIL import Image, ImageDraw, PngImagePlugin

    sections = {"decode": ("the validation input decoded to a waveform", None, decoded)}
    if clip is not None:
        sections = {"reconstruction": ("the test waveform encoded and decoded", clip, reconstructions), **sections}
    heights = {name: Layout(0, 0).section_height(3 + (given is not None)) for name, (_, given, _) in sections.items()}
    image = Image.new("RGB", (LABEL_WIDTH + WAVE_WIDTH + GAP, sum(heights.values())), BACKGROUND)
    draw, text, maxima, offset = ImageDraw.Draw(image), PngImagePlugin.PngInfo(), {}, 0
    for name, (title, given, (got, expected)) in sections.items():
        got, expected = got[0], expected[0]
        with np.errstate(invalid="ignore", over="ignore"):  # a failed validation's NaN or Inf draws as nothing
            difference = np.abs(got.astype(np.float64) - expected.astype(np.float64))
            peak = float(difference.max())
            draw.text((4, offset + 4), title, fill=(0, 0, 0))
            rows = [("converted", got), ("reference", expected), ("|difference|", difference)]
            rows = ([("input", given[0])] if given is not None else []) + rows
            for row, (label, wave) in enumerate(rows):
                top = offset + TITLE_HEIGHT + row * (TILE + GAP)
                draw.text((4, top + TILE // 2 - 6), label, fill=(0, 0, 0))
                heat = label == "|difference|"
                levels = wave / peak if heat and peak else wave
                image.paste(Image.fromarray(_plot(levels, heat=heat)), (LABEL_WIDTH, top))
            left, top = LABEL_WIDTH, offset + TITLE_HEIGHT + len(rows) * (TILE + GAP)
            bar = heat_colours(np.linspace(0.0, 1.0, 2 * TILE))[None].repeat(10, axis=0)
            image.paste(Image.fromarray(bar), (left, top))
            draw.text((left, top + 12), "0", fill=(0, 0, 0))
            draw.text((left + 2 * TILE - 70, top + 12), f"max {peak:.2e}", fill=(0, 0, 0))
        text.add_text(HEAT_TEXT_KEYS[name], repr(peak))
        maxima[name], offset = peak, offset + heights[name]
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, pnginfo=text)
    return maxima


def _plot(wave: np.ndarray, heat: bool) -> np.ndarray:
    """(TILE, WAVE_WIDTH, 3) uint8: each channel of `wave` (C, N) in a band of its own, every pixel column spanning
    the range of the samples it covers: values in [-1, 1] about the band's middle, or (`heat`) levels in [0, 1] up
    from its bottom, coloured by level."""
    channels, samples = wave.shape
    band = TILE // channels
    starts = np.arange(WAVE_WIDTH) * samples // WAVE_WIDTH  # each column's first sample (repeated where N < width)
    plot = np.full((TILE, WAVE_WIDTH, 3), BACKGROUND, np.uint8)
    rows = np.arange(band)[:, None]
    for channel, values in enumerate(np.nan_to_num(wave, nan=0.0)):
        low, high = np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)
        if heat:
            bottom, top = np.full(WAVE_WIDTH, band - 1.0), (1.0 - np.clip(high, 0, 1)) * (band - 1)
            colours = np.broadcast_to(heat_colours(np.clip(high, 0, 1))[None], (band, WAVE_WIDTH, 3))
        else:
            top, bottom = ((1.0 - np.clip(v, -1, 1)) / 2 * (band - 1) for v in (high, low))
            colours = np.broadcast_to(np.array(WAVE_COLOUR, np.uint8), (band, WAVE_WIDTH, 3))
        inside = (rows >= np.floor(top)) & (rows <= np.ceil(bottom))
        plot[channel * band : (channel + 1) * band][inside] = colours[inside]
    return plot


def write_wav(path: Path, waveform: np.ndarray, sample_rate: int):
    """(C, N) samples in [-1, 1] as a 16-bit PCM WAV file of C channels."""
    import wave

    pcm = np.rint(np.clip(np.nan_to_num(waveform.astype(np.float64)), -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as file:
        file.setnchannels(pcm.shape[0])
        file.setsampwidth(2)
        file.setframerate(sample_rate)
        file.writeframes(np.ascontiguousarray(pcm.T).tobytes())


def _draw(path: Path, layout: Layout, sections: dict) -> dict:
    from PIL import Image, ImageDraw, PngImagePlugin

    image = Image.new("RGB", layout.size, BACKGROUND)
    draw = ImageDraw.Draw(image)
    maxima, text = {}, PngImagePlugin.PngInfo()
    with np.errstate(invalid="ignore", over="ignore"):  # a failed validation's NaN or Inf draws as black, silently
        _draw_sections(draw, image, layout, sections, maxima, text)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, pnginfo=text)
    return maxima


def _draw_sections(draw, image, layout, sections: dict, maxima: dict, text):
    from PIL import Image

    titles = {"reconstruction": "test clip: encode -> decode", "decode": "validation latent: decode"}
    labels = {"reconstruction": ["input", "converted", "reference", "|difference|"]}
    labels["decode"] = labels["reconstruction"][1:]
    for section, videos in sections.items():
        got, expected = videos[-2], videos[-1]
        difference = np.abs(got.astype(np.float64) - expected.astype(np.float64)).max(axis=0)  # (T, H, W)
        maxima[section] = float(difference.max())
        _, top = layout.tile(section, 0, 0)
        draw.text((4, top - TITLE_HEIGHT + 4), titles[section], fill=(0, 0, 0))
        indices = frame_indices(got.shape[1], hottest=int(difference.max(axis=(1, 2)).argmax()))
        rows = [[to_rgb(video[:, t]) for t in indices] for video in videos]
        rows.append(
            [heat_colours(difference[t] / maxima[section] if maxima[section] else difference[t]) for t in indices]
        )
        for row, (label, tiles) in enumerate(zip(labels[section], rows)):
            x, y = layout.tile(section, row, 0)
            draw.text((4, y + TILE // 2 - 6), label, fill=(0, 0, 0))
            for column, tile in enumerate(tiles):
                image.paste(_scaled(Image.fromarray(tile)), layout.tile(section, row, column))
        left, top, right, bottom = layout.colour_bar(section)
        bar = heat_colours(np.linspace(0.0, 1.0, right - left))[None].repeat(bottom - top, axis=0)
        image.paste(Image.fromarray(bar), (left, top))
        draw.text((left, bottom + 2), "0", fill=(0, 0, 0))
        draw.text((right - 70, bottom + 2), f"max {maxima[section]:.2e}", fill=(0, 0, 0))
        text.add_text(HEAT_TEXT_KEYS[section], repr(maxima[section]))


def _scaled(tile):
    """A frame scaled to fit TILE: enlarged by a whole factor (nearest neighbour: every source pixel a square block),
    or a larger one shrunk (each output pixel the mean of the pixels it covers)."""
    from PIL import Image

    side = max(tile.size)
    if side > TILE:
        size = (max(1, tile.size[0] * TILE // side), max(1, tile.size[1] * TILE // side))
        return tile.resize(size, Image.Resampling.BOX)
    factor = max(1, TILE // side)
    return tile.resize((tile.size[0] * factor, tile.size[1] * factor), Image.Resampling.NEAREST)
