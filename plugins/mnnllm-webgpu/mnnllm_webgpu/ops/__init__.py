"""Op creators of the webgpu backend, one module per op family (kernels in shaders/*.wgsl).
Every creator refuses a tensor larger than one storage binding; every other op runs on cpu."""

CREATORS: dict = {}
