#!/bin/sh
# Regenerates backends/vulkan/shaders/*.spv from the GLSL sources next to them
# (needs glslangValidator, Debian package glslang-tools). Commit the .spv files.
# Shaders with subgroup operations need SPIR-V 1.3 (Vulkan 1.1); the others stay at 1.0.
set -eu
cd "$(dirname "$0")/../backends/vulkan/shaders"
for source in *.comp; do
    included=$(sed -n 's/^#include "\(.*\)"/\1/p' "$source")
    if grep -q GL_KHR_shader_subgroup "$source" $included; then
        glslangValidator -V --quiet --target-env vulkan1.1 "$source" -o "${source%.comp}.spv"
    else
        glslangValidator -V --quiet "$source" -o "${source%.comp}.spv"
    fi
done
