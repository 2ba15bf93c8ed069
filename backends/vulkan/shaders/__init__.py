"""Compute shaders of the vulkan backend: GLSL sources and their SPIR-V (scripts/build_vulkan_shaders.sh)."""
