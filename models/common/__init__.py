"""What the model families share: config base, chunk runners per framework, tiling, conv lowering, sharding."""
