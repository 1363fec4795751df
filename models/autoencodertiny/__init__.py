"""The tiny VAEs (diffusers' AutoencoderTiny: TAESD, TAESDXL, TAESD3, TAEF1) in Flax NNX and in PyTorch for torchax."""
