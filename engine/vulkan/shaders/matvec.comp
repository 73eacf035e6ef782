#version 450
// One projection of one expert for a tile of activation rows:
//
//	out[r][j] = sum_i W[j][i] * a[r][i],  j in [0, rows), r in [0, cnt)
//
// W is a rows x cols matrix of ggml blocks of type TYPE at byte w_off of the
// expert's weight buffer (row j at w_off + j*row_bytes); a and out are
// float32 in the scratch buffer. Workgroup (w, t) computes rows
// [w*RPW, w*RPW+RPW) for the activation rows [t*TB, t*TB+TB), one row per
// subgroup at a time. Each lane dequantises chunks of 32 weights
// (dequantisation formulas of ggml's dequantize_row_* in
// ggml/src/ggml-quants.c @3f545bec, as engine/quant/dequant.go mirrors them;
// block layouts of ggml-common.h at the same commit) and
// multiplies them with the float32 activations; subgroupAdd sums the
// lanes' partial dot products (Vulkan 1.1 subgroup arithmetic).
//
// The activations are float32 values that are already rounded to the
// weight type's ggml vec_dot_type (Q8_0, Q8_1, Q8_K, F16, BF16 or F32;
// engine/quant.ConvertActivation's values), so every product equals
// ggml-cpu's integer block dot product up to float32 rounding.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifndef ROW_PER_LANE
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
layout(local_size_x = 64) in;
#include "common.glsl"

// The scratch buffer again, as vec4 (activation rows start at multiples of
// 4 floats).
layout(set = 0, binding = 0) buffer Scratch4 { vec4 s4[]; };

layout(push_constant) uniform Params {
    uint w_off;     // byte offset of the matrix in the weight buffer
    uint rows;      // output rows
    uint cols;      // elements per row (a multiple of 32)
    uint row_bytes; // bytes per row
    uint a_off;     // float index of activation row 0 in s
    uint o_off;     // float index of output row 0 in s
    uint cnt;       // activation rows
    uint s_off;     // Q4_1, Q5_1: float index of the activations' block sums s (Q8_1)
} p;

// m of the last Q4_1/Q5_1 block deq32 read (its values come without it).
float blk_m = 0.0;

#define TB 8  // activation rows per workgroup
#define RPW 8 // weight rows per workgroup

// deq32 dequantises elements [32*c, 32*c+32) of the row at byte rb.
void deq32(uint rb, uint c, out float v[32]) {
#if defined(TYPE_F32)
    uint o = rb + c * 128u;
    [[unroll]] for (uint i = 0u; i < 32u; i++) v[i] = uintBitsToFloat(rd32(o + 4u * i));
#elif defined(TYPE_F16)
    uint o = rb + c * 64u;
    [[unroll]] for (uint i = 0u; i < 16u; i++) {
        vec2 f = unpackHalf2x16(rd32(o + 4u * i));
        v[2u * i] = f.x;
        v[2u * i + 1u] = f.y;
    }
#elif defined(TYPE_BF16)
    uint o = rb + c * 64u;
    [[unroll]] for (uint i = 0u; i < 16u; i++) {
        uint u = rd32(o + 4u * i);
        v[2u * i] = uintBitsToFloat(u << 16);
        v[2u * i + 1u] = uintBitsToFloat(u & 0xFFFF0000u);
    }
#elif defined(TYPE_Q8_0)
    // block_q8_0 (34 B): d fp16 | qs[32] int8; x = d*q.
    uint o = rb + c * 34u;
    float d = rdf16(o);
    [[unroll]] for (uint i = 0u; i < 32u; i++) v[i] = d * float(rds8(o + 2u + i));
#elif defined(TYPE_Q4_0)
    // block_q4_0 (18 B): d fp16 | qs[16]; x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8).
    uint o = rb + c * 18u;
    float d = rdf16(o);
    [[unroll]] for (uint i = 0u; i < 16u; i++) {
        uint q = rd8(o + 2u + i);
        v[i] = d * float(int(q & 15u) - 8);
        v[i + 16u] = d * float(int(q >> 4) - 8);
    }
#elif defined(TYPE_Q4_1)
    // block_q4_1 (20 B): d, m fp16 | qs[16]; x = d*q + m. The m part is
    // added per block as m*s with the activation block's s = fp16(d*sum q)
    // (block_q8_1), as ggml_vec_dot_q4_1_q8_1 does.
    uint o = rb + c * 20u;
    float d = rdf16(o);
    blk_m = rdf16(o + 2u);
    [[unroll]] for (uint i = 0u; i < 16u; i++) {
        uint q = rd8(o + 4u + i);
        v[i] = d * float(q & 15u);
        v[i + 16u] = d * float(q >> 4);
    }
#elif defined(TYPE_Q5_0)
    // block_q5_0 (22 B): d fp16 | qh u32 | qs[16]; 5th bit of x[j] = qh bit j; x = d*(q-16).
    uint o = rb + c * 22u;
    float d = rdf16(o);
    uint qh = rd32(o + 2u);
    [[unroll]] for (uint i = 0u; i < 16u; i++) {
        uint q = rd8(o + 6u + i);
        v[i] = d * float(int((q & 15u) | (((qh >> i) & 1u) << 4)) - 16);
        v[i + 16u] = d * float(int((q >> 4) | (((qh >> (i + 16u)) & 1u) << 4)) - 16);
    }
#elif defined(TYPE_Q5_1)
    // block_q5_1 (24 B): d, m fp16 | qh u32 | qs[16]; x = d*q + m (m as
    // for Q4_1, ggml_vec_dot_q5_1_q8_1).
    uint o = rb + c * 24u;
    float d = rdf16(o);
    blk_m = rdf16(o + 2u);
    uint qh = rd32(o + 4u);
    [[unroll]] for (uint i = 0u; i < 16u; i++) {
        uint q = rd8(o + 8u + i);
        v[i] = d * float((q & 15u) | (((qh >> i) & 1u) << 4));
        v[i + 16u] = d * float((q >> 4) | (((qh >> (i + 16u)) & 1u) << 4));
    }
#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
    // block_q4_K (144 B): d, dmin fp16 | scales[12] | qs[128];
    // block_q5_K (176 B): d, dmin fp16 | scales[12] | qh[32] | qs[128].
    // Sub-block j (32 values) has a 6-bit scale and min (get_scale_min_k4);
    // x = d*sc*q - dmin*m, q the low (j even) or high (j odd) nibbles of
    // qs[32*(j/2) .. +32], plus 16 for Q5_K where qh[l] bit j is set.
#if defined(TYPE_Q4_K)
    uint o = rb + (c >> 3) * 144u;
    uint qo = o + 16u;
#else
    uint o = rb + (c >> 3) * 176u;
    uint qo = o + 48u;
#endif
    uint j = c & 7u;
    float d = rdf16(o), dmin = rdf16(o + 2u);
    uint sc, mn;
    if (j < 4u) {
        sc = rd8(o + 4u + j) & 63u;
        mn = rd8(o + 8u + j) & 63u;
    } else {
        sc = (rd8(o + 8u + j) & 15u) | ((rd8(o + j) >> 6) << 4);
        mn = (rd8(o + 8u + j) >> 4) | ((rd8(o + 4u + j) >> 6) << 4);
    }
    float d1 = d * float(sc), m1 = dmin * float(mn);
    uint shift = (j & 1u) * 4u;
    // Rows of these types are whole 4-byte words (144 or 176 bytes per
    // 256 elements), so the 32 quant bytes are read as 8 words.
    uint qw = (qo + 32u * (j >> 1)) >> 2;
    [[unroll]] for (uint t = 0u; t < 8u; t++) {
        uint word = w[qw + t];
#if defined(TYPE_Q5_K)
        uint hword = w[((o + 16u) >> 2) + t];
#endif
        [[unroll]] for (uint b = 0u; b < 4u; b++) {
            uint q = (word >> (8u * b + shift)) & 15u;
#if defined(TYPE_Q5_K)
            q += ((hword >> (8u * b + j)) & 1u) << 4;
#endif
            v[4u * t + b] = d1 * float(q) - m1;
        }
    }
#elif defined(TYPE_Q6_K)
    // block_q6_K (210 B): ql[128] | qh[64] | scales[16] int8 | d fp16.
    // Chunk c = 4n+k of the block (half n, quarter k): element l (0..31) is
    // ((ql[64n + l + 32(k&1)] >> 4(k>>1)) & 15 | ((qh[32n+l] >> 2k) & 3) << 4) - 32,
    // scaled by d*scales[8n + l/16 + 2k].
    uint o = rb + (c >> 3) * 210u;
    uint j = c & 7u, n = j >> 2, k = j & 3u;
    float d = rdf16(o + 208u);
    float s0 = d * float(rds8(o + 192u + 8u * n + 2u * k));
    float s1 = d * float(rds8(o + 192u + 8u * n + 2u * k + 1u));
    uint lo = o + 64u * n + 32u * (k & 1u), hs = 4u * (k >> 1);
    [[unroll]] for (uint l = 0u; l < 32u; l++) {
        uint ql = (rd8(lo + l) >> hs) & 15u;
        uint qh = (rd8(o + 128u + 32u * n + l) >> (2u * k)) & 3u;
        v[l] = (l < 16u ? s0 : s1) * float(int(ql | (qh << 4)) - 32);
    }
#else
#error "TYPE_* not defined"
#endif
}

#ifdef ROW_PER_LANE
// The row-per-lane variant (spv/matvec_row_*.spv, for CPU drivers such as
// lavapipe and devices without subgroup arithmetic): invocation j of
// workgroup (w, t) computes the whole row w*64 + j for the activation rows
// [t*TB, t*TB+TB). All lanes read the same activations (one load for the
// SIMD group on a CPU driver) and sum their row alone, in chunk order.
void main() {
    uint j = gl_GlobalInvocationID.x;
    if (j >= p.rows) {
        return;
    }
    uint r0 = gl_WorkGroupID.y * TB;
    uint nr = min(TB, p.cnt - r0);
    uint chunks = p.cols / 32u;
    float acc[TB];
    [[unroll]] for (uint r = 0u; r < TB; r++) acc[r] = 0.0;
    uint rb = p.w_off + j * p.row_bytes;
    for (uint c = 0u; c < chunks; c++) {
        float v[32];
        deq32(rb, c, v);
        [[unroll]] for (uint r = 0u; r < TB; r++) {
            if (r >= nr) {
                break;
            }
            uint a4 = (p.a_off + (r0 + r) * p.cols + c * 32u) >> 2;
            vec4 sum4 = vec4(0.0);
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                sum4 += vec4(v[4u * i], v[4u * i + 1u], v[4u * i + 2u], v[4u * i + 3u]) * s4[a4 + i];
            }
            float sum = (sum4.x + sum4.y) + (sum4.z + sum4.w);
#if defined(TYPE_Q4_1) || defined(TYPE_Q5_1)
            sum += blk_m * s[p.s_off + (r0 + r) * chunks + c];
#endif
            acc[r] += sum;
        }
    }
    [[unroll]] for (uint r = 0u; r < TB; r++) {
        if (r >= nr) {
            break;
        }
        s[p.o_off + (r0 + r) * p.rows + j] = acc[r];
    }
}
#else
void main() {
    // Subgroup g of the workgroup computes rows j = RPW*wg + g, + NumSubgroups,
    // ...: its lanes take the row's chunks in turn and subgroupAdd sums
    // their partial dot products (no shared memory, no barrier).
    uint lane = gl_SubgroupInvocationID;
    uint r0 = gl_WorkGroupID.y * TB;
    uint nr = min(TB, p.cnt - r0);
    uint chunks = p.cols / 32u;
    for (uint jj = gl_SubgroupID; jj < RPW; jj += gl_NumSubgroups) {
        uint j = gl_WorkGroupID.x * RPW + jj;
        if (j >= p.rows) {
            break;
        }
        float acc[TB];
        [[unroll]] for (uint r = 0u; r < TB; r++) acc[r] = 0.0;
        uint rb = p.w_off + j * p.row_bytes;
        for (uint c = lane; c < chunks; c += gl_SubgroupSize) {
            float v[32];
            deq32(rb, c, v);
            [[unroll]] for (uint r = 0u; r < TB; r++) {
                if (r >= nr) {
                    break;
                }
                uint a4 = (p.a_off + (r0 + r) * p.cols + c * 32u) >> 2;
                vec4 sum4 = vec4(0.0);
                [[unroll]] for (uint i = 0u; i < 8u; i++) {
                    sum4 += vec4(v[4u * i], v[4u * i + 1u], v[4u * i + 2u], v[4u * i + 3u]) * s4[a4 + i];
                }
                float sum = (sum4.x + sum4.y) + (sum4.z + sum4.w);
#if defined(TYPE_Q4_1) || defined(TYPE_Q5_1)
                sum += blk_m * s[p.s_off + (r0 + r) * chunks + c];
#endif
                acc[r] += sum;
            }
        }
        [[unroll]] for (uint r = 0u; r < TB; r++) {
            if (r >= nr) {
                break;
            }
            float t = subgroupAdd(acc[r]);
            if (lane == 0u) {
                s[p.o_off + (r0 + r) * p.rows + j] = t;
            }
        }
    }
}
#endif
