"""vae-convert: Hugging Face PyTorch video-VAE checkpoints -> Flax NNX (Orbax) or torchax (safetensors) weights."""
__version__ = "0.1.0"


def load(path):
    """A converted output directory -> a ready model (see converter.api)."""
    from converter.api import load as _load

    return _load(path)
