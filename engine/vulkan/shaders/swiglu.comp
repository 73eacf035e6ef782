#version 450
// The SwiGLU of every (row, slot) pair, rounded to the down projection's
// activation type:
//
//	h[i] = round_T( silu(g[i]) * u[i] ),  silu(x) = x / (1 + e^-x)
//
// (ggml_vec_swiglu_f32, ggml/src/ggml-cpu/vec.h), for i in [0, n) where g,
// u and h are float32 regions of the scratch buffer. round_T gives the
// float32 value of the element once converted to down's ggml vec_dot_type,
// as engine/quant.ConvertActivation converts it (ggml-cpu's
// quantize_row_q8_0 / q8_1 AVX2 branches and quantize_row_q8_K_ref in
// ggml-quants.c; FP32ToFP16 and FP32ToBF16 round to nearest even):
//
//	mode 0 F32:  x
//	mode 1 F16:  fp16(x)
//	mode 2 BF16: bf16(x)
//	mode 3 Q8_0 (blocks of 32): d = fp16(amax/127),
//	             q = roundeven(x*(127/amax)), value fp16(d)*q
//	mode 5 Q8_1: as Q8_0, and the block's s = fp16((amax/127)*sum(q))
//	             is written to s[s_off + block]
//	mode 4 Q8_K (blocks of 256): m = the first element of largest |x|,
//	             s = -127/m, q = min(127, roundeven(s*x)), value q/s
//
// One workgroup handles 256 consecutive elements (n is a multiple of the
// block size, and blocks never straddle rows because rows are whole
// blocks).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
#include "common.glsl"

layout(push_constant) uniform Params {
    uint g_off; // float index of g in s
    uint u_off; // float index of u
    uint h_off; // float index of h
    uint n;     // elements
    uint mode;
    uint s_off; // mode 5: float index of the block sums
} p;

shared float amax[256];
shared uint arg[256];

// fp16 rounds x to the nearest binary16 value (ties to even), as
// engine/quant.FP32ToFP16 (x86 VCVTPS2PH) does, and returns it as float32.
float fp16(float x) {
    uint b = floatBitsToUint(x);
    uint sign = b & 0x80000000u;
    uint e = (b >> 23) & 0xFFu;
    uint m = b & 0x7FFFFFu;
    if (e == 0xFFu) return x;
    int he = int(e) - 127 + 15;
    if (he >= 31) return uintBitsToFloat(sign | 0x7F800000u);
    uint r;
    if (he <= 0) {
        // binary16 subnormal: units of 2^-24.
        if (he < -10) return uintBitsToFloat(sign);
        uint mm = m | 0x800000u;
        uint sh = uint(14 - he);
        r = mm >> sh;
        uint rem = mm & ((1u << sh) - 1u), half_ = 1u << (sh - 1u);
        if (rem > half_ || (rem == half_ && (r & 1u) == 1u)) r++;
        float val = float(r) * exp2(-24.0);
        return sign != 0u ? -val : val;
    }
    r = m >> 13;
    uint rem = m & 0x1FFFu;
    uint h = (uint(he) << 10) | r;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u) == 1u)) h++;
    if ((h >> 10) >= 31u) return uintBitsToFloat(sign | 0x7F800000u);
    return unpackHalf2x16(h | (sign >> 16)).x;
}

// bf16 rounds x to bfloat16 (ties to even; NaN kept quiet), as
// engine/quant.FP32ToBF16 (ggml_compute_fp32_to_bf16) does.
float bf16(float x) {
    uint u = floatBitsToUint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uintBitsToFloat((u | 0x400000u) & 0xFFFF0000u);
    u = (u + (0x7FFFu + ((u >> 16) & 1u))) & 0xFFFF0000u;
    return uintBitsToFloat(u);
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint i = gl_WorkGroupID.x * 256u + tid;
    bool in_ = i < p.n;
    float x = 0.0;
    if (in_) {
        float g = s[p.g_off + i];
        x = g / (1.0 + exp(-g)) * s[p.u_off + i];
    }
    if (p.mode <= 2u) {
        if (in_) {
            s[p.h_off + i] = p.mode == 0u ? x : (p.mode == 1u ? fp16(x) : bf16(x));
        }
        return;
    }
    // Block maximum of |x| (first index of the largest on ties).
    uint bs = p.mode == 4u ? 256u : 32u;
    amax[tid] = abs(x);
    arg[tid] = tid;
    barrier();
    for (uint st = bs >> 1; st > 0u; st >>= 1) {
        uint lane = tid & (bs - 1u);
        if (lane < st) {
            float a = amax[tid], b = amax[tid + st];
            if (b > a) {
                amax[tid] = b;
                arg[tid] = arg[tid + st];
            }
        }
        barrier();
    }
    uint first = tid & ~(bs - 1u);
    float am = amax[first];
    barrier();
    float v = 0.0;
    if (p.mode == 3u || p.mode == 5u) {
        float d = am / 127.0;
        float id = am != 0.0 ? 127.0 / am : 0.0;
        float q = clamp(roundEven(x * id), -128.0, 127.0);
        v = fp16(d) * q;
        if (p.mode == 5u) {
            amax[tid] = q;
            barrier();
            for (uint st = 16u; st > 0u; st >>= 1) {
                if ((tid & 31u) < st) amax[tid] += amax[tid + st];
                barrier();
            }
            if ((tid & 31u) == 0u && in_) s[p.s_off + i / 32u] = fp16(d * amax[tid]);
        }
    } else if (am != 0.0) {
        // max is read back as a value: the shared x of the arg element.
        amax[tid] = x;
        barrier();
        float mx = amax[arg[first]];
        float is = -127.0 / mx;
        v = min(127.0, roundEven(is * x)) * (1.0 / is);
    }
    if (in_) s[p.h_off + i] = v;
}
