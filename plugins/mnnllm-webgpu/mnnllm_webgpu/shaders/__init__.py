"""The WGSL kernels (one file per kernel), read by device.Compiler."""
