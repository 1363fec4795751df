"""Model implementations, one folder per family: a Flax NNX model, a PyTorch model for torchax, their config."""
