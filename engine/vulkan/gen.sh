#!/bin/sh
# Compiles the GLSL compute shaders of engine/vulkan to SPIR-V (run by
# `go generate ./engine/vulkan/`; needs glslc from shaderc, Debian package
# glslc). The .spv files are committed and embedded, so building kvasir
# needs no shader compiler; TestSPIRVUpToDate recompiles them when the same
# glslc version (spv/GLSLC_VERSION) is installed and checks the bytes.
set -eu
cd "$(dirname "$0")"
out=${1:-spv}
mkdir -p "$out"
flags="--target-env=vulkan1.1 -O -fshader-stage=compute"
for t in F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K; do
  glslc $flags -DTYPE_$t -o "$out/matvec_$t.spv" shaders/matvec.comp
  glslc $flags -DTYPE_$t -DROW_PER_LANE -o "$out/matvec_row_$t.spv" shaders/matvec.comp
done
glslc $flags -o "$out/swiglu.spv" shaders/swiglu.comp
glslc --version | head -n 1 > "$out/GLSLC_VERSION"
