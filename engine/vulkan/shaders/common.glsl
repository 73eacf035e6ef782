// Shared declarations of kvasir's expert kernels (engine/vulkan).
//
// set 0, binding 0: the call's scratch buffer of float32 (activations in,
// gate/up/SwiGLU intermediates, outputs); set 1, binding 0: one expert's
// weights (gate, up and down matrices, raw ggml blocks) read as uint32 words.

layout(set = 0, binding = 0) buffer Scratch { float s[]; };
layout(set = 1, binding = 0) readonly buffer Weights { uint w[]; };

// Byte readers over the little-endian weight words (blocks are not
// 4-byte aligned: block_q8_0 is 34 bytes).
uint rd8(uint o) { return (w[o >> 2] >> ((o & 3u) << 3)) & 0xFFu; }
uint rd16(uint o) {
    if ((o & 1u) == 0u) {
        return (w[o >> 2] >> ((o & 2u) << 3)) & 0xFFFFu;
    }
    return rd8(o) | (rd8(o + 1u) << 8);
}
uint rd32(uint o) {
    if ((o & 3u) == 0u) {
        return w[o >> 2];
    }
    return rd16(o) | (rd16(o + 2u) << 16);
}
int rds8(uint o) { return bitfieldExtract(int(rd8(o)), 0, 8); }
float rdf16(uint o) { return unpackHalf2x16(rd16(o)).x; }
