#!/bin/sh
# Regenerates backends/vulkan/shaders/*.spv from the GLSL sources next to them
# (needs glslangValidator, Debian package glslang-tools). Commit the .spv files.
set -eu
cd "$(dirname "$0")/../backends/vulkan/shaders"
for source in *.comp; do
    glslangValidator -V --quiet "$source" -o "${source%.comp}.spv"
done
