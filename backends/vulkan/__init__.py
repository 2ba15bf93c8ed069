"""The vulkan backend (the `vulkan` package; lavapipe on machines without a GPU): packed 4-bit
weights dequantized in the shader, every dispatch of a run recorded into one command buffer.
See runtime.py for the device selection hint and device.py for the memory model."""
