"""The opencl backend (pyopencl): packed quantized weights and a device-resident KV cache.
See runtime.py for device selection and the precision / kernel-shape hints."""
