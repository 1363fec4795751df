"""What the tests and the test tools need to know about a family, kept in its folder (models/<family>/testing.py)
and out of the runtime spec: small widths, the frame counts and tile and mesh settings the generic tests run, extra
configs for `check-mappings`, how its original release files are written for tests. Imported only by
`random-checkpoint --small`, `check-mappings`, the benchmark's smoke mode and the tests."""

from __future__ import annotations

import dataclasses

# `enable_tiling` settings for the small test models: 32-pixel tiles every 24 (at 8x, 4 latents every 3, so a
# 7-latent side is cut into 4, 4 and 1)
SMALL_TILES = dict(
    tile_sample_min_height=32,
    tile_sample_min_width=32,
    tile_sample_stride_height=24,
    tile_sample_stride_width=24,
)


@dataclasses.dataclass(frozen=True)
class TilingCase:
    """`enable_tiling` settings (the same keywords for diffusers and for us) that make a small model tile, on grids
    with short last rows and columns."""

    tiling: dict
    latent: tuple[int, int, int]  # (T, H, W) decoded
    video: tuple[int, int, int]  # (T, H, W) encoded
    decode_steps: int  # distinct chunk steps of one tile's decode (first chunk, steady chunk)
    targets: tuple[str, ...] = ("flax",)
    # distinct tile shapes of the decode: inner tiles, last column, last row, corner (1 where every tile is whole)
    tile_shapes: int = 4


@dataclasses.dataclass(frozen=True)
class OriginalFileCase:
    """An original release format as tests write it: the diffusers state_dict renamed with the format's pairings."""

    small: str  # which small config
    file_name: str  # as released
    config_changes: dict = dataclasses.field(default_factory=dict)  # the released block structure, where it differs
    wrapper: str | None = None  # the key the released pickle nests the tensors under
    training_key: str | None = None  # a key of training state the release keeps beside the model's, dropped by rule
    validated_target: str = "flax"  # the target whose conversion also runs the validation decode/encode
    # a release that keeps each part in a file of its own (converter/sources.py): `file_name` is then the name the
    # parts' files are named after (taesd.safetensors: taesd_encoder.safetensors, taesd_decoder.safetensors)
    split_by_part: bool = False


@dataclasses.dataclass(frozen=True)
class FamilyTesting:
    # Small widths, each compared against diffusers by the generic tests; the first, "default-arch", is the default
    # architecture at small widths; the others change the structure. `random-checkpoint --small` takes the first of
    # the model's variant.
    small_configs: dict[str, dict]
    # Latent frames the parity tests decode and video frames they encode: where the causal cache and the frame
    # batching show
    parity_frames: tuple[tuple[int, ...], tuple[int, ...]]
    tiling: dict[str, TilingCase]  # by small config
    # small config -> the (dp, tp, axis type) meshes its sharded decode and encode are compared on
    meshes: dict[str, tuple[tuple[int, int, str], ...]]
    export: tuple[str, ...]  # small configs whose diffusers -> target -> diffusers round trip is checked bit-exact
    original_files: dict[str, OriginalFileCase] = dataclasses.field(default_factory=dict)  # by source format
    # configs `check-mappings` proves the rules against, beside the named models' own
    check_configs: tuple[tuple[str, dict], ...] = ()
    # the sizes after the channels (and frames) of the latents the parity tests decode, and of the samples they
    # encode, at each frame count: a video's or an image's (height, width), a waveform's (samples,)
    parity_latent_sizes: tuple[tuple[int, ...], ...] = ((4, 4),)
    parity_video_sizes: tuple[tuple[int, ...], ...] = ((16, 16),)
    # distinct steps a decode of the longest parity latent compiles (the first chunk and the steady one; LTX, with no
    # cache and no frame tiles by default, decodes in one)
    decode_steps: int = 2
    # whether the suite converts its first model at full size (test_full_size.py); the benchmark always does
    full_size: bool = True
    # variants (the config's `variant`) whose full-size run the suite leaves to the family's first: their layout is
    # compared with diffusers at small widths, and their published configs plan every key (test_published_configs)
    full_size_left_to_first: tuple[str, ...] = ()
