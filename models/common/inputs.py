"""The models' input checks: one clear ValueError instead of a shape error deep inside a convolution."""

from __future__ import annotations


def expect_video(
    x,
    channels: int,
    *,
    channels_last: bool,
    what: str,
    multiple: int = 1,
    minimum: int = 1,
    frames: int | None = None,
    frame_hop: int = 1,
):
    """x must be (B, T, H, W, C) (channels_last) or (B, C, T, H, W), with `channels` channels, at least one frame
    (exactly `frames` where given: an image model's one; 1 + k * `frame_hop` frames, where the model reshapes time
    by its hop), and height and width that are multiples of `multiple` and at least `minimum`."""
    layout = "(B, T, H, W, C), channels-last" if channels_last else "(B, C, T, H, W), channels-first"
    if x.ndim != 5:
        raise ValueError(f"{what}: expected a 5-d array {layout}; got shape {tuple(x.shape)}")
    b, t, h, w, c = x.shape if channels_last else (x.shape[0], *x.shape[2:], x.shape[1])
    if c != channels:
        raise ValueError(f"{what}: expected {channels} channels in {layout}; got shape {tuple(x.shape)}")
    if b < 1 or t < 1:
        raise ValueError(f"{what}: needs at least one video and one frame; got shape {tuple(x.shape)}")
    if frames is not None and t != frames:
        raise ValueError(f"{what}: takes {frames} frame(s) (T = {frames}: one image), got shape {tuple(x.shape)}")
    if (t - 1) % frame_hop:
        first = ", ".join(str(1 + k * frame_hop) for k in range(3))
        raise ValueError(f"{what}: takes 1 + {frame_hop}k frames ({first}, ...); got T = {t}")
    if h < 1 or w < 1 or h % multiple or w % multiple:
        raise ValueError(f"{what}: height and width must be positive multiples of {multiple}; got {h}x{w}")
    if min(h, w) < minimum:
        raise ValueError(f"{what}: height and width must be at least {minimum}; got {h}x{w}")


def expect_image(x, channels: int, *, channels_last: bool, what: str, minimum: int | tuple[int, int] = 1):
    """x must be (B, H, W, C) (channels_last) or (B, C, H, W), with `channels` channels and sides of at least
    `minimum` pixels, or (height, width) (what the model's downsamplers need)."""
    layout = "(B, H, W, C), channels-last" if channels_last else "(B, C, H, W), channels-first"
    if x.ndim != 4:
        raise ValueError(f"{what}: expected a 4-d array {layout} (an image model); got shape {tuple(x.shape)}")
    b, h, w, c = x.shape if channels_last else (x.shape[0], *x.shape[2:], x.shape[1])
    if c != channels:
        raise ValueError(f"{what}: expected {channels} channels in {layout}; got shape {tuple(x.shape)}")
    least_h, least_w = minimum if isinstance(minimum, tuple) else (minimum, minimum)
    if b < 1 or h < least_h or w < least_w:
        raise ValueError(
            f"{what}: needs at least one image of at least {least_h}x{least_w} pixels; got shape {tuple(x.shape)}"
        )


def expect_spectrogram(x, flattened: int, *, channels_last: bool, what: str):
    """x must be (B, T, mel bins, C) (channels_last) or (B, C, T, mel bins): a spectrogram whose channels and mel
    bins together are the `flattened` channels a vocoder takes, of at least one frame."""
    layout = "(B, T, mel bins, C), channels-last" if channels_last else "(B, C, T, mel bins), channels-first"
    if x.ndim != 4:
        raise ValueError(f"{what}: expected a 4-d spectrogram {layout}; got shape {tuple(x.shape)}")
    b, t, bins, c = x.shape if channels_last else (x.shape[0], *x.shape[2:], x.shape[1])
    if c * bins != flattened:
        raise ValueError(f"{what}: expected C x mel bins = {flattened} in {layout}; got shape {tuple(x.shape)}")
    if b < 1 or t < 1:
        raise ValueError(f"{what}: needs at least one spectrogram of one frame; got shape {tuple(x.shape)}")


def expect_sequence(x, channels: int, *, channels_last: bool, what: str):
    """x must be (B, L, C) (channels_last) or (B, C, L): a waveform of `channels` channels, or the latent sequence
    an audio VAE decodes, at least one sample long."""
    layout = "(B, L, C), channels-last" if channels_last else "(B, C, L), channels-first"
    if x.ndim != 3:
        raise ValueError(f"{what}: expected a 3-d array {layout}; got shape {tuple(x.shape)}")
    b, length, c = x.shape if channels_last else (x.shape[0], x.shape[2], x.shape[1])
    if c != channels:
        raise ValueError(f"{what}: expected {channels} channels in {layout}; got shape {tuple(x.shape)}")
    if b < 1 or length < 1:
        raise ValueError(f"{what}: needs at least one sequence of one step; got shape {tuple(x.shape)}")
