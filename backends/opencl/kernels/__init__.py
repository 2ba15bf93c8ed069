"""OpenCL C sources of the opencl backend; `common.cl` is prepended to every file."""
