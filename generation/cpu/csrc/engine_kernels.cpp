// The engine's CPU kernels for one decode step, built at first use by generation/native.py (g++ -O3
// -march=native -fopenmp) and called through ctypes with raw pointers and element strides:
//   provmark_rope_cache_attention  a Llama attention block's decode step after its fused q/k/v matmul:
//                                  rotary embedding, cache write, attention over each row's own keys;
//   provmark_decode_attention      the attention alone (row b over the first lengths[b] keys of its slot);
//   provmark_cache_write           each row's new key and value written at its own position of its slot;
//   provmark_paged_*               the same three over the paged cache (rows found through block tables);
//   provmark_rms_norm              RMSNorm as Llama-style decoders compute it;
//   provmark_silu_mul              silu(gate) * up over the fused gate/up projection's output;
//   provmark_pack_linear,
//   provmark_linear                linears at decode batch sizes, weights streamed at memory speed;
//   provmark_gemv                  the same at one row, G weight streams in flight (batch-1 decode);
//   provmark_watermark_bias        the green-list bias, the same integers as watermark/greenlist.py.
//   provmark_gumbel_survivors      the tokens that can still win the Gumbel race (watermark/gumbel.py).
//   provmark_top_head              a row's largest values when they are distinct (generation/sample/top_head.py).
//   provmark_synthid_tournament    SynthID's tournament over a head of candidates (watermark/synthid.py).
// The small ones replace a handful of torch ops each (a few microseconds of dispatch apiece, about a
// thousand per decode step of the default model).
//
// Why an attention kernel of our own: a batched SDPA call must read every row up to the longest one, and
// the CPU SDPA path streams the cache well below memory speed for one query token. Here each (row,
// key/value head) work item reads its keys and values exactly once, for all the query heads that share
// them (GQA), and the items are spread over OpenMP threads (the process's libgomp, the one torch loaded).
//
// Numerics: scores, softmax and the weighted sum are in fp32 whatever the cache dtype; bf16 output is
// rounded to nearest even, as torch does.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <omp.h>

namespace {

inline float bf16_to_float(uint16_t h) {
    return __builtin_bit_cast(float, static_cast<uint32_t>(h) << 16);
}

inline uint16_t float_to_bf16(float f) {
    uint32_t x = __builtin_bit_cast(uint32_t, f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
}

// bfloat16 linear weights are packed in pairs of inputs (pair_tile): this many pairs for k inputs.
inline int64_t pair_count(int64_t k) { return (k + 1) / 2; }

inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) { return bf16_to_float(x); }
template <typename T> inline T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline uint16_t from_float<uint16_t>(float x) { return float_to_bf16(x); }
// x rounded to the storage type T and back (torch rounds every op's result to the tensor's dtype)
inline float round_through(const float*, float x) { return x; }
inline float round_through(const uint16_t*, float x) { return bf16_to_float(float_to_bf16(x)); }

inline void load_row(const float* src, float* dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

inline void load_row(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
    for (int64_t d = 0; d < n; ++d) dst[d] = bf16_to_float(src[d]);
}

inline void store_row(const float* src, float* dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

inline void store_row(const float* src, uint16_t* dst, int64_t n) {
    for (int64_t d = 0; d < n; ++d) dst[d] = float_to_bf16(src[d]);
}

// Where key/value row j of one (row, kv head) work item lives: a slot's rows at a fixed stride, or a paged
// cache's rows through the row's block table (blocks of 2**shift rows, `block_stride` elements apart).
template <typename T>
struct StridedRows {
    const T* k;
    const T* v;
    int64_t st;
    const T* key(int64_t j) const { return k + j * st; }
    const T* value(int64_t j) const { return v + j * st; }
};

template <typename T>
struct PagedRows {
    const T* k;
    const T* v;
    const int64_t* table;
    int64_t block_stride, st, shift, mask;
    int64_t at(int64_t j) const { return table[j >> shift] * block_stride + (j & mask) * st; }
    const T* key(int64_t j) const { return k + at(j); }
    const T* value(int64_t j) const { return v + at(j); }
};

// One (row, kv head) item: `group` query heads against `len` keys. Two passes over the keys: scores
// (keys read once, every query head of the group scored against each key row while it is in L1), then
// the softmax-weighted sum of the values (read once).
template <typename T, typename A>
void attend(const T* q, int64_t q_sh, const A& kv, int64_t len, int64_t group,
            int64_t dim, float scale, T* out, std::vector<float>& scratch) {
    scratch.resize(static_cast<size_t>(group * dim * 2 + dim + group * len + group));
    float* qf = scratch.data();           // [group, dim]
    float* acc = qf + group * dim;        // [group, dim]
    float* row = acc + group * dim;       // [dim]
    float* scores = row + dim;            // [group, len]
    float* total = scores + group * len;  // [group]
    for (int64_t g = 0; g < group; ++g) load_row(q + g * q_sh, qf + g * dim, dim);
    for (int64_t j = 0; j < len; ++j) {
        load_row(kv.key(j), row, dim);
        for (int64_t g = 0; g < group; ++g) {
            const float* qg = qf + g * dim;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < dim; ++d) dot += qg[d] * row[d];
            scores[g * len + j] = dot * scale;
        }
    }
    for (int64_t g = 0; g < group; ++g) {
        float* s = scores + g * len;
        float top = -INFINITY;
        for (int64_t j = 0; j < len; ++j) top = s[j] > top ? s[j] : top;
        float sum = 0.f;
        for (int64_t j = 0; j < len; ++j) {
            s[j] = std::exp(s[j] - top);
            sum += s[j];
        }
        total[g] = sum;
    }
    std::memset(acc, 0, static_cast<size_t>(group * dim) * sizeof(float));
    for (int64_t j = 0; j < len; ++j) {
        load_row(kv.value(j), row, dim);
        for (int64_t g = 0; g < group; ++g) {
            const float p = scores[g * len + j];
            float* a = acc + g * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; ++d) a[d] += p * row[d];
        }
    }
    for (int64_t g = 0; g < group; ++g) {
        const float inv = 1.f / total[g];
        float* a = acc + g * dim;
        for (int64_t d = 0; d < dim; ++d) a[d] *= inv;
        store_row(a, out + g * dim, dim);
    }
}

#if defined(__AVX512F__)
// AVX-512 path for head dims of 64 and 128 and up to 8 query heads per key/value head: the query heads
// and the value accumulators live in registers, the exponentials are vectorised.

template <int NV>
inline void load_vecs(const float* p, __m512* out) {
    for (int i = 0; i < NV; ++i) out[i] = _mm512_loadu_ps(p + 16 * i);
}

template <int NV>
inline void load_vecs(const uint16_t* p, __m512* out) {
    for (int i = 0; i < NV; ++i) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * i));
        out[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

// exp(x) to about 1 ulp for x in [-87, 88] (clamped outside): x = n ln2 + r, |r| <= ln2/2, e^r by its
// degree-7 Taylor polynomial, then scaled by 2^n
inline __m512 vexp(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// Keys and values are streamed from memory (the cache far exceeds L2): rows this far ahead are asked for
// into L2 (T1), not L1: a core has few L1 miss buffers, and with T0 hints a 64-row decode step's attention
// (30 layers, 169 keys a row) read the cache at 17 GB/s; into L2, 32 rows ahead, at 24 GB/s (16: 22 GB/s at
// 400 keys a row, 26 at 32; 64 and 128 rows ahead slower). benchmarks/decode_attention.py measures it.
constexpr int64_t PREFETCH_KEYS = 32;
inline void prefetch_row(const void* row, size_t bytes) {
    const char* p = static_cast<const char*>(row);
    for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
}

// The 16 horizontal sums of v[0..15], as one vector (lane j = sum of v[j]).
inline __m512 reduce16(const __m512* v) {
    __m512 u[8], w[4];
    for (int i = 0; i < 8; ++i)  // 256-bit halves: [v_i lo+hi | v_i+8 lo+hi]
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xee));
    for (int i = 0; i < 4; ++i)  // 128-bit blocks: [v_i | v_i+8 | v_i+4 | v_i+12], four partial sums each
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[i], u[i + 4], 0x88), _mm512_shuffle_f32x4(u[i], u[i + 4], 0xdd));
    const __m512 x0 = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
    const __m512 x1 = _mm512_add_ps(_mm512_unpacklo_ps(w[2], w[3]), _mm512_unpackhi_ps(w[2], w[3]));
    const __m512 y = _mm512_add_ps(_mm512_shuffle_ps(x0, x1, 0x44), _mm512_shuffle_ps(x0, x1, 0xee));
    // y holds sums 0-3, 8-11, 4-7, 12-15 by 128-bit block
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15), y);
}

// q . k for the G query heads of one kv head: ``partial`` leaves a vector whose lanes sum to the dot product.
template <typename T, int NV, int G>
struct KeyDot {
    __m512 qv[G][NV];
    explicit KeyDot(const T* q, int64_t q_sh) {
        for (int g = 0; g < G; ++g) load_vecs<NV>(q + g * q_sh, qv[g]);
    }
    inline void partials(const T* key, __m512* out, int stride) const {
        __m512 kv[NV];
        load_vecs<NV>(key, kv);
        for (int g = 0; g < G; ++g) {
            __m512 acc = _mm512_mul_ps(qv[g][0], kv[0]);
            for (int i = 1; i < NV; ++i) acc = _mm512_fmadd_ps(qv[g][i], kv[i], acc);
            out[g * stride] = acc;
        }
    }
};

#if defined(__AVX512BF16__)
// bf16 keys and queries: vdpbf16ps multiplies bf16 pairs exactly and accumulates in fp32, no conversions.
template <int NV, int G>
struct KeyDot<uint16_t, NV, G> {
    static_assert(NV % 2 == 0, "bf16 pairs need an even number of 16-lane vectors");
    __m512bh qb[G][NV / 2];
    explicit KeyDot(const uint16_t* q, int64_t q_sh) {
        for (int g = 0; g < G; ++g)
            for (int i = 0; i < NV / 2; ++i)
                qb[g][i] = (__m512bh)_mm512_loadu_si512(q + g * q_sh + 32 * i);
    }
    inline void partials(const uint16_t* key, __m512* out, int stride) const {
        __m512bh kb[NV / 2];
        for (int i = 0; i < NV / 2; ++i) kb[i] = (__m512bh)_mm512_loadu_si512(key + 32 * i);
        for (int g = 0; g < G; ++g) {
            __m512 acc = _mm512_dpbf16_ps(_mm512_setzero_ps(), qb[g][0], kb[0]);
            for (int i = 1; i < NV / 2; ++i) acc = _mm512_dpbf16_ps(acc, qb[g][i], kb[i]);
            out[g * stride] = acc;
        }
    }
};
#endif

template <typename T, int NV, int G, typename A>
void attend_fixed(const T* q, int64_t q_sh, const A& kv, int64_t len, float scale,
                  T* out, std::vector<float>& scratch) {
    scratch.resize(static_cast<size_t>(G * (len + 16)));
    float* scores = scratch.data();  // [G, len] (row stride len + 16 keeps the vector tails in bounds)
    const int64_t stride = len + 16;
    for (int64_t r = 0; r < PREFETCH_KEYS && r < len; ++r) {  // both passes' first rows
        prefetch_row(kv.key(r), NV * 16 * sizeof(T));
        prefetch_row(kv.value(r), NV * 16 * sizeof(T));
    }
    const KeyDot<T, NV, G> dot(q, q_sh);
    const __m512 scale_v = _mm512_set1_ps(scale);
    __m512 part[G * 16];  // [G][16 keys]
    __m512 running_max[G];  // per query head, lane-wise over the blocks (a scalar max chain cost a third)
    float top_tail[G];
    for (int g = 0; g < G; ++g) {
        running_max[g] = _mm512_set1_ps(-INFINITY);
        top_tail[g] = -INFINITY;
    }
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) {  // 16 keys at a time: one transposed reduction per query head
        for (int jj = 0; jj < 16; ++jj) {
            if (j + jj + PREFETCH_KEYS < len) prefetch_row(kv.key(j + jj + PREFETCH_KEYS), NV * 16 * sizeof(T));
            dot.partials(kv.key(j + jj), part + jj, 16);
        }
        for (int g = 0; g < G; ++g) {
            const __m512 sv = _mm512_mul_ps(reduce16(part + g * 16), scale_v);
            running_max[g] = _mm512_max_ps(running_max[g], sv);
            _mm512_storeu_ps(scores + g * stride + j, sv);
        }
    }
    for (; j < len; ++j) {
        dot.partials(kv.key(j), part, 1);
        for (int g = 0; g < G; ++g) {
            const float sc = _mm512_reduce_add_ps(part[g]) * scale;
            scores[g * stride + j] = sc;
            top_tail[g] = sc > top_tail[g] ? sc : top_tail[g];
        }
    }
    float total[G];
    for (int g = 0; g < G; ++g) {
        float* s = scores + g * stride;
        const float block_top = _mm512_reduce_max_ps(running_max[g]);
        const float top = block_top > top_tail[g] ? block_top : top_tail[g];
        const __m512 topv = _mm512_set1_ps(top);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < len; j += 16) {
            const __mmask16 m = len - j >= 16 ? static_cast<__mmask16>(0xffff)
                                              : static_cast<__mmask16>((1u << (len - j)) - 1u);
            const __m512 e = vexp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), topv));
            _mm512_mask_storeu_ps(s + j, m, e);
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
        }
        total[g] = _mm512_reduce_add_ps(sum);
    }
    __m512 acc[G][NV];
    for (int g = 0; g < G; ++g)
        for (int i = 0; i < NV; ++i) acc[g][i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < len; ++j) {
        __m512 vv[NV];
        if (j + PREFETCH_KEYS < len) prefetch_row(kv.value(j + PREFETCH_KEYS), NV * 16 * sizeof(T));
        load_vecs<NV>(kv.value(j), vv);
        for (int g = 0; g < G; ++g) {
            const __m512 p = _mm512_set1_ps(scores[g * stride + j]);
            for (int i = 0; i < NV; ++i) acc[g][i] = _mm512_fmadd_ps(p, vv[i], acc[g][i]);
        }
    }
    float row[NV * 16];
    for (int g = 0; g < G; ++g) {
        const __m512 inv = _mm512_set1_ps(1.f / total[g]);
        for (int i = 0; i < NV; ++i) _mm512_storeu_ps(row + 16 * i, _mm512_mul_ps(acc[g][i], inv));
        store_row(row, out + g * NV * 16, NV * 16);
    }
}

template <typename T, int NV, typename A>
bool attend_dispatch_group(const T* q, int64_t q_sh, const A& kv, int64_t len,
                           int64_t group, float scale, T* out, std::vector<float>& scratch) {
    switch (group) {
#define PROVMARK_GROUP(G) \
    case G: attend_fixed<T, NV, G>(q, q_sh, kv, len, scale, out, scratch); return true;
        PROVMARK_GROUP(1) PROVMARK_GROUP(2) PROVMARK_GROUP(3) PROVMARK_GROUP(4)
        PROVMARK_GROUP(5) PROVMARK_GROUP(6) PROVMARK_GROUP(7) PROVMARK_GROUP(8)
#undef PROVMARK_GROUP
        default: return false;
    }
}

template <typename T, typename A>
bool attend_fast(const T* q, int64_t q_sh, const A& kv, int64_t len, int64_t group,
                 int64_t dim, float scale, T* out, std::vector<float>& scratch) {
    if (dim == 64) return attend_dispatch_group<T, 4>(q, q_sh, kv, len, group, scale, out, scratch);
    if (dim == 128) return attend_dispatch_group<T, 8>(q, q_sh, kv, len, group, scale, out, scratch);
    return false;
}

inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const uint16_t* p, __mmask16 m) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void store16(float* p, __m512 x, __mmask16 m) { _mm512_mask_storeu_ps(p, m, x); }
// float -> bf16 bits, rounded to nearest even (NaN stays NaN)
inline __m256i to_bf16(__m512 x) {
#if defined(__AVX512BF16__)
    return (__m256i)_mm512_cvtneps_pbh(x);
#else
    __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    u = _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x400000));  // quiet NaN, not rounded
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
#endif
}
inline void store16(uint16_t* p, __m512 x, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, to_bf16(x)); }
// Rounds a float vector through the storage type T and back, as torch does between two ops.
inline __m512 through(const float*, __m512 x) { return x; }
inline __m512 through(const uint16_t*, __m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(x)), 16));
}
inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

// silu(g) * up: the activation rounded to T before the product (two torch ops); 1 / (1 + e^-g) by a
// reciprocal estimate and one Newton step (within an ulp of the division, at a fraction of its cost).
template <typename T>
void silu_mul_row(const T* gate, const T* up, T* out, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.f), two = _mm512_set1_ps(2.f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 g = load16(gate + i, m);
        const __m512 d = _mm512_add_ps(one, vexp(_mm512_sub_ps(_mm512_setzero_ps(), g)));
        __m512 r = _mm512_rcp14_ps(d);
        r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, two));
        const __m512 act = _mm512_mul_ps(g, r);
        store16(out + i, _mm512_mul_ps(through(out, act), load16(up + i, m)), m);
    }
}

// o = w * round_T(x * inv) (LlamaRMSNorm after its variance)
template <typename T>
void scale_row(const T* x, const T* w, float inv, T* o, int64_t dim) {
    const __m512 iv = _mm512_set1_ps(inv);
    for (int64_t d = 0; d < dim; d += 16) {
        const __mmask16 m = tail_mask(dim - d);
        const __m512 normed = through(o, _mm512_mul_ps(load16(x + d, m), iv));
        store16(o + d, _mm512_mul_ps(load16(w + d, m), normed), m);
    }
}

// y = round(round(x * cos) + round(rotate_half(x) * sin)); vectorised when each half is whole vectors
template <typename T>
void rope_head(const T* x, const T* cos, const T* sin, T* y, int64_t dim) {
    const int64_t half = dim / 2;
    if (half % 16 != 0) {
        for (int64_t d = 0; d < dim; ++d) {
            const float rot = d < half ? -to_float(x[d + half]) : to_float(x[d - half]);
            const float a = round_through(y, to_float(x[d]) * to_float(cos[d]));
            const float b = round_through(y, rot * to_float(sin[d]));
            y[d] = from_float<T>(a + b);
        }
        return;
    }
    const __mmask16 all = 0xffff;
    const __m512 sign = _mm512_set1_ps(-0.f);
    for (int64_t d = 0; d < dim; d += 16) {
        const __m512 xv = load16(x + d, all);
        __m512 rot = load16(x + (d < half ? d + half : d - half), all);
        if (d < half) rot = _mm512_xor_ps(rot, sign);
        const __m512 a = through(y, _mm512_mul_ps(xv, load16(cos + d, all)));
        const __m512 b = through(y, _mm512_mul_ps(rot, load16(sin + d, all)));
        store16(y + d, _mm512_add_ps(a, b), all);
    }
}
#else
template <typename T>
void silu_mul_row(const T* gate, const T* up, T* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = to_float(gate[i]);
        const float act = round_through(out, g / (1.f + std::exp(-g)));
        out[i] = from_float<T>(act * to_float(up[i]));
    }
}

template <typename T>
void scale_row(const T* x, const T* w, float inv, T* o, int64_t dim) {
    for (int64_t d = 0; d < dim; ++d) o[d] = from_float<T>(to_float(w[d]) * round_through(o, to_float(x[d]) * inv));
}

template <typename T>
void rope_head(const T* x, const T* cos, const T* sin, T* y, int64_t dim) {
    const int64_t half = dim / 2;
    for (int64_t d = 0; d < dim; ++d) {
        const float rot = d < half ? -to_float(x[d + half]) : to_float(x[d - half]);
        const float a = round_through(y, to_float(x[d]) * to_float(cos[d]));
        const float b = round_through(y, rot * to_float(sin[d]));
        y[d] = from_float<T>(a + b);
    }
}

template <typename T, typename A>
bool attend_fast(const T*, int64_t, const A&, int64_t, int64_t, int64_t, float, T*,
                 std::vector<float>&) {
    return false;
}
#endif

// Attention of each (row, kv head) item over its lengths[b] keys, the items spread over OpenMP threads;
// rows(b, h) says where that item's keys and values live (StridedRows or PagedRows).
template <typename T, typename Rows>
void run_items(const T* q, int64_t q_sb, int64_t q_sh, const Rows& rows, const int64_t* lengths, T* out,
               int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim, float scale, int threads) {
    const int64_t group = heads / kv_heads;
    const int64_t items = batch * kv_heads;
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; ++item) {
            const int64_t b = item / kv_heads, h = item % kv_heads;
            const int64_t first = h * group;  // query heads h*group .. h*group+group-1 share kv head h
            const T* qi = q + b * q_sb + first * q_sh;
            const auto kv = rows(b, h);
            T* oi = out + (b * heads + first) * dim;
            if (!attend_fast<T>(qi, q_sh, kv, lengths[b], group, dim, scale, oi, scratch))
                attend<T>(qi, q_sh, kv, lengths[b], group, dim, scale, oi, scratch);
        }
    }
}

template <typename T>
void run(const void* query, int64_t q_sb, int64_t q_sh, const void* keys, const void* values, int64_t kv_sb,
         int64_t kv_sh, int64_t kv_st, const int64_t* lengths, void* output, int64_t batch, int64_t heads,
         int64_t kv_heads, int64_t dim, float scale, int threads) {
    const T* k = static_cast<const T*>(keys);
    const T* v = static_cast<const T*>(values);
    auto rows = [=](int64_t b, int64_t h) {
        return StridedRows<T>{k + b * kv_sb + h * kv_sh, v + b * kv_sb + h * kv_sh, kv_st};
    };
    run_items<T>(static_cast<const T*>(query), q_sb, q_sh, rows, lengths, static_cast<T*>(output), batch, heads,
                 kv_heads, dim, scale, threads);
}

// The paged cache: keys/values [blocks, kv_heads, 2**shift, dim] (strides c_sb, c_sh, c_st); row b's
// position p lives in block tables[b * table_stride + (p >> shift)].
template <typename T>
void run_paged(const void* query, int64_t q_sb, int64_t q_sh, const void* keys, const void* values, int64_t c_sb,
               int64_t c_sh, int64_t c_st, int64_t shift, const int64_t* tables, int64_t table_stride,
               const int64_t* lengths, void* output, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
               float scale, int threads) {
    const T* k = static_cast<const T*>(keys);
    const T* v = static_cast<const T*>(values);
    const int64_t mask = (int64_t{1} << shift) - 1;
    auto rows = [=](int64_t b, int64_t h) {
        return PagedRows<T>{k + h * c_sh, v + h * c_sh, tables + b * table_stride, c_sb, c_st, shift, mask};
    };
    run_items<T>(static_cast<const T*>(query), q_sb, q_sh, rows, lengths, static_cast<T*>(output), batch, heads,
                 kv_heads, dim, scale, threads);
}

// True when every row's blocks 0..(lengths[b] - 1) >> shift are in 0..num_blocks-1 and its length in
// 1..table_stride << shift.
inline bool tables_ok(const int64_t* tables, int64_t table_stride, int64_t shift, int64_t num_blocks,
                      const int64_t* lengths, int64_t batch) {
    if (shift < 0 || shift > 20 || table_stride < 1) return false;
    for (int64_t b = 0; b < batch; ++b) {
        if (lengths[b] < 1 || lengths[b] > (table_stride << shift)) return false;
        for (int64_t i = 0; i <= (lengths[b] - 1) >> shift; ++i) {
            const int64_t blk = tables[b * table_stride + i];
            if (blk < 0 || blk >= num_blocks) return false;
        }
    }
    return true;
}

// y = w * round(x / sqrt(mean(x^2) + eps)): the norm in fp32, rounded to T before the weight multiplies
// (LlamaRMSNorm's order of operations).
template <typename T>
void rms_norm_rows(const T* x, int64_t x_stride, const T* w, float eps, T* out, int64_t rows, int64_t dim) {
#pragma omp parallel for if (rows * dim >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * x_stride;
        T* o = out + r * dim;
        float sq = 0.f;
#pragma omp simd reduction(+ : sq)
        for (int64_t d = 0; d < dim; ++d) {
            const float v = to_float(xr[d]);
            sq += v * v;
        }
        scale_row(xr, w, 1.f / std::sqrt(sq / static_cast<float>(dim) + eps), o, dim);
    }
}

template <typename T>
void silu_mul_rows(const T* gu, int64_t gu_stride, int64_t inner, T* out, int64_t rows) {
#pragma omp parallel for if (rows * inner >= (1 << 14))
    for (int64_t r = 0; r < rows; ++r) silu_mul_row<T>(gu + r * gu_stride, gu + r * gu_stride + inner, out + r * inner, inner);
}

template <typename T>
void cache_write_rows(T* keys, T* values, int64_t c_sb, int64_t c_sh, int64_t c_st, const T* new_k,
                      int64_t k_sb, int64_t k_sh, const T* new_v, int64_t v_sb, int64_t v_sh,
                      const int64_t* positions, int64_t batch, int64_t kv_heads, int64_t dim) {
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t h = 0; h < kv_heads; ++h) {
            const int64_t at = b * c_sb + h * c_sh + positions[b] * c_st;
            std::memcpy(keys + at, new_k + b * k_sb + h * k_sh, static_cast<size_t>(dim) * sizeof(T));
            std::memcpy(values + at, new_v + b * v_sb + h * v_sh, static_cast<size_t>(dim) * sizeof(T));
        }
}


// A decode linear as the engine holds it: W packed by provmark_pack_linear (float32 [n/16][k][16], bfloat16 in
// pairs, or int8 [n/16][k][16] with a float32 scale per output), bias [n] or null. rows <= gemv_rows: the 1-row
// kernel; else the tiles (apply_linear, below): the same dispatch as provmark_linear / provmark_gemv / their _q8
// forms, so every caller gets the same bits. Declared on every build, AVX-512 or not: provmark_decode_stack's
// DecodeLayer names it (tests/test_kernels_without_avx512.py builds for a CPU without AVX-512).
struct LinearRef {
    const void* packed;
    const float* scales;  // non-null: int8 weights
    const void* bias;
    int64_t n, k, gemv_rows;
};

#if defined(__AVX512F__)
// Linear for decode batches: y = x W^T + b with W packed as [n/16][k][16] (each block of 16 outputs stored
// k-major, so one load holds the 16 outputs' weights for input k). A tile of up to 8 rows times 32 outputs
// keeps its 16 fp32 accumulators in registers; each x value is broadcast once for both blocks. At decode
// batch sizes a step streams every weight from memory: fp32 at 16 rows, this reads them at about 17 GB/s
// on a 2-core Sapphire Rapids CPU where oneDNN's packed kernel reaches 12. It runs float32 weights, and int8
// ones widened to fp32 in registers (exact); products accumulate in fp32, the output is rounded once. bfloat16
// weights have their own layout and kernels (pair_tile, below).
//
// Prefetch: while a unit of 32 outputs runs its row tiles, each tile fetches its share of the thread's next unit's
// weights into L1 (the unit's cache lines split evenly over its tiles, a line or two per step of k). The memory
// stream then never waits for the FMAs: at 16 rows the second tile, which finds its weights in cache, used to
// leave the memory idle. Against fetching each block's own rows 32 ahead (benchmarks/decode_linears.py --against,
// the default model's weights, 2 threads, a 2-core AMD EPYC), the old time over the new: float32 1.22 at 16 rows,
// 1.02 at 64, 0.98 at 8; the bfloat16 pairs (pair_tile) 1.32, 1.48 and 1.20 at 8, 16 and 64 rows.

// unmasked 16-lane load/store: with the masked forms (load16/store16) this loop ran about a third slower
inline __m512 load_full16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_full16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
// int8 weights (the opt-in int8 path): 16 values widened to fp32 exactly; the output's scale is applied once, at the end
inline __m512 load_full16(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline void store_full16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline void store_full16(uint16_t* p, __m512 x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(x)); }

template <typename W, typename T, int M, int NB>
void linear_tile(const float* x, int64_t x_stride, int64_t k, const W* wp, const float* scale, const T* bias, T* y,
                 int64_t y_stride, const char* fetch, int64_t fetch_lines) {
    const int64_t per_step = (fetch_lines + k - 1) / k;  // cache lines of the next unit fetched per step of k
    __m512 acc[NB][M];
    for (int b = 0; b < NB; ++b)
        for (int m = 0; m < M; ++m) acc[b][m] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; ++kk) {
        for (int64_t j = kk * per_step; j < (kk + 1) * per_step && j < fetch_lines; ++j)
            _mm_prefetch(fetch + j * 64, _MM_HINT_T0);
        __m512 w[NB];
        for (int b = 0; b < NB; ++b) w[b] = load_full16(wp + b * k * 16 + kk * 16);
        for (int m = 0; m < M; ++m) {
            const __m512 xb = _mm512_set1_ps(x[m * x_stride + kk]);
            for (int b = 0; b < NB; ++b) acc[b][m] = _mm512_fmadd_ps(xb, w[b], acc[b][m]);
        }
    }
    for (int b = 0; b < NB; ++b) {
        const __m512 bv = bias ? load_full16(bias + 16 * b) : _mm512_setzero_ps();
        if (scale) {  // int8 weights: y = scale * sum(x * q) + bias
            const __m512 sv = _mm512_loadu_ps(scale + 16 * b);
            for (int m = 0; m < M; ++m) acc[b][m] = _mm512_mul_ps(acc[b][m], sv);
        }
        for (int m = 0; m < M; ++m) store_full16(y + m * y_stride + 16 * b, _mm512_add_ps(acc[b][m], bv));
    }
}

// f(std::integral_constant<int, c>{}) for a count c in 1..8: the kernels are templated on their rows or blocks.
template <typename F>
inline void with_count(int64_t c, F&& f) {
    switch (c) {
        case 1: f(std::integral_constant<int, 1>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 5: f(std::integral_constant<int, 5>{}); break;
        case 6: f(std::integral_constant<int, 6>{}); break;
        case 7: f(std::integral_constant<int, 7>{}); break;
        case 8: f(std::integral_constant<int, 8>{}); break;
        default: break;
    }
}

// The cache lines [first, last) of a unit's ``lines`` that the row tile starting at row r of ``rows`` fetches: the
// lines split evenly over the unit's tiles of 8 rows (linear_rows, pair_rows).
struct FetchShare {
    int64_t first, last;
};
inline FetchShare fetch_share(int64_t lines, int64_t rows, int64_t r) {
    const int64_t tiles = (rows + 7) / 8, t = r / 8;
    return {lines * t / tiles, lines * (t + 1) / tiles};
}

// The row tiles of one unit; ``next`` (null for none) is the thread's next unit of ``next_outputs`` outputs, whose
// weights the tiles fetch in turn.
template <typename W, typename T, int NB>
void linear_rows(const float* x, int64_t x_stride, int64_t rows, int64_t k, const W* wp, const float* scale,
                 const T* bias, T* y, int64_t y_stride, const W* next, int64_t next_outputs) {
    const int64_t lines = next ? next_outputs * k * static_cast<int64_t>(sizeof(W)) / 64 : 0;
    for (int64_t r = 0; r < rows; r += 8)
        with_count(rows - r >= 8 ? 8 : rows - r, [&](auto m) {
            const FetchShare f = fetch_share(lines, rows, r);
            linear_tile<W, T, decltype(m)::value, NB>(x + r * x_stride, x_stride, k, wp, scale, bias, y + r * y_stride,
                                                      y_stride, reinterpret_cast<const char*>(next) + f.first * 64,
                                                      f.last - f.first);
        });
}

// Rows are taken LINEAR_ROW_BLOCK at a time, every output unit over one block before the next: a block's inputs
// stay in cache while all the weights pass (a prefill's thousands of rows were otherwise re-read from memory for
// each 32-output unit). Each output is still one sum over k in order, so the blocking never changes a bit.
constexpr int64_t LINEAR_ROW_BLOCK = 64;

// unit(r0, block, n0, two) for every unit of 32 outputs (the last one 16 when n is not a multiple of 32: ``two``
// false) over every block of rows, the units of a block spread over the threads.
template <typename F>
void for_units(int64_t rows, int64_t n, int threads, F&& unit) {
    const int64_t pairs = n / 32, units = pairs + (n % 32 != 0);
    for (int64_t r0 = 0; r0 < rows; r0 += LINEAR_ROW_BLOCK) {
        const int64_t block = rows - r0 < LINEAR_ROW_BLOCK ? rows - r0 : LINEAR_ROW_BLOCK;
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t u = 0; u < units; ++u) unit(r0, block, u * 32, u < pairs);
    }
}

template <typename W, typename T>
void linear_all(const float* x, int64_t x_stride, const W* packed, const float* scale, const T* bias, T* y,
                int64_t rows, int64_t n, int64_t k, int threads) {
    for_units(rows, n, threads, [&](int64_t r0, int64_t block, int64_t n0, bool two) {
        const W* wp = packed + n0 * k;  // block n0/16 starts at (n0 / 16) * k * 16
        const float* s = scale ? scale + n0 : nullptr;
        const T* b = bias ? bias + n0 : nullptr;
        // the next unit (schedule(static): this thread's, but at the end of its share of the units)
        const int64_t next_outputs = std::min<int64_t>(n - n0 - 32, 32);
        const W* next = next_outputs > 0 ? packed + (n0 + 32) * k : nullptr;
        if (two)
            linear_rows<W, T, 2>(x + r0 * x_stride, x_stride, block, k, wp, s, b, y + r0 * n + n0, n, next,
                                 next_outputs);
        else
            linear_rows<W, T, 1>(x + r0 * x_stride, x_stride, block, k, wp, s, b, y + r0 * n + n0, n, next,
                                 next_outputs);
    });
}

// One row: y = x W^T + b over the same packed layout, G blocks of 16 outputs at a time (G accumulator chains
// in flight, so the loop is bound by the weights' stream, not by the FMA latency: the 8-row tile above keeps
// two chains at one row). Each output is summed in exactly the tile's order (k ascending, one fused
// multiply-add per input, the bias added last), so the two kernels agree bit for bit. The blocks are split
// evenly over the threads (no tail unit on one thread) and every weight is read once. No software prefetch:
// the hardware prefetchers follow the G streams, and prefetching 24 weight rows ahead in each made the 30
// layers' and the LM head's weights stream about 15 % slower (G = 4, 6 or 8 within noise of each other).
#ifndef PROVMARK_GEMV_GROUP
#define PROVMARK_GEMV_GROUP 8
#endif

template <typename W, typename T, int G>
inline void gemv_group(const float* x, int64_t k, const W* wp, const float* scale, const T* bias, T* y) {
    __m512 acc[G];
    for (int b = 0; b < G; ++b) acc[b] = _mm512_setzero_ps();
    const int64_t stride = k * 16;
    for (int64_t kk = 0; kk < k; ++kk) {
        const __m512 xb = _mm512_set1_ps(x[kk]);
        for (int b = 0; b < G; ++b) acc[b] = _mm512_fmadd_ps(xb, load_full16(wp + b * stride + kk * 16), acc[b]);
    }
    for (int b = 0; b < G; ++b) {
        const __m512 bv = bias ? load_full16(bias + 16 * b) : _mm512_setzero_ps();
        if (scale) acc[b] = _mm512_mul_ps(acc[b], _mm512_loadu_ps(scale + 16 * b));  // as linear_tile
        store_full16(y + 16 * b, _mm512_add_ps(acc[b], bv));
    }
}

constexpr int GEMV_GROUP = PROVMARK_GEMV_GROUP;  // at most 8

// group(b, g) for runs of g <= GEMV_GROUP blocks of 16 outputs starting at block b: the blocks split evenly over
// the threads (no tail unit on one thread).
template <typename F>
void for_groups(int64_t n, int threads, F&& group) {
    const int64_t blocks = n / 16;
    if (threads > blocks) threads = static_cast<int>(blocks);
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
        for (int64_t b = b0; b < b1; b += GEMV_GROUP) group(b, b1 - b >= GEMV_GROUP ? GEMV_GROUP : b1 - b);
    }
}

template <typename W, typename T>
void gemv_all(const float* x, const W* packed, const float* scale, const T* bias, T* y, int64_t n, int64_t k,
              int threads) {
    for_groups(n, threads, [&](int64_t b, int64_t g) {
        with_count(g, [&](auto c) {
            gemv_group<W, T, decltype(c)::value>(x, k, packed + b * k * 16, scale ? scale + b * 16 : nullptr,
                                                 bias ? bias + b * 16 : nullptr, y + b * 16);
        });
    });
}

// bfloat16 weights in pairs: W packed [n/16][k/2][16][2] (per block of 16 outputs, inputs 2i and 2i+1 of every
// output side by side), so one 64-byte load holds 16 outputs' weights for two inputs, and with AVX512-BF16 one
// vdpbf16ps multiplies them by the broadcast pair of inputs (products exact, summed in fp32): twice the work of
// an fp32 FMA per instruction and no widening of the weights or the inputs. Without AVX512-BF16 the pair is
// widened and multiplied by two FMAs. The tile (up to 8 rows x 32 outputs) and the 1-row kernel sum each output
// in the same order (pairs ascending, the bias last), so they give the same bits. The default model's weights at
// 8, 16 and 64 rows: 10.1, 16.9 and 47.0 ms against oneDNN's 14.1, 20.7 and 55.3 (and 17.6 ms at 8 rows for the
// widening tile above) on the 2-core AMD EPYC.
struct PairX {
#if defined(__AVX512BF16__)
    __m512bh v;
#else
    __m512 lo, hi;
#endif
};

inline PairX pair_x(const uint16_t* x) {
    int32_t bits;
    std::memcpy(&bits, x, sizeof(bits));
    PairX out;
#if defined(__AVX512BF16__)
    out.v = (__m512bh)_mm512_set1_epi32(bits);
#else
    out.lo = _mm512_set1_ps(bf16_to_float(static_cast<uint16_t>(bits & 0xffff)));
    out.hi = _mm512_set1_ps(bf16_to_float(static_cast<uint16_t>(static_cast<uint32_t>(bits) >> 16)));
#endif
    return out;
}

// The last input of an odd k, paired with a zero (its weight pair's second half is zero too).
inline PairX pair_x_last(const uint16_t* x) {
    const uint16_t both[2] = {x[0], 0};
    return pair_x(both);
}


inline __m512i pair_weights(const uint16_t* w) { return _mm512_loadu_si512(w); }

inline __m512 pair_fma(__m512 acc, const PairX& x, __m512i wv) {
#if defined(__AVX512BF16__)
    return _mm512_dpbf16_ps(acc, x.v, (__m512bh)wv);
#else
    acc = _mm512_fmadd_ps(x.lo, _mm512_castsi512_ps(_mm512_slli_epi32(wv, 16)), acc);
    return _mm512_fmadd_ps(x.hi, _mm512_castsi512_ps(_mm512_and_si512(wv, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))), acc);
#endif
}

template <int M, int NB>
void pair_tile(const uint16_t* x, int64_t x_stride, int64_t k, const uint16_t* wp, const uint16_t* bias, uint16_t* y,
               int64_t y_stride, const char* fetch, int64_t fetch_lines) {
    __m512 acc[NB][M];
    for (int b = 0; b < NB; ++b)
        for (int m = 0; m < M; ++m) acc[b][m] = _mm512_setzero_ps();
    const int64_t block = pair_count(k) * 32, full = k / 2;
    const int64_t per_step = (fetch_lines + pair_count(k) - 1) / pair_count(k);  // as linear_tile
    for (int64_t kp = 0; kp <= full; ++kp) {  // kp == full: an odd k's last input, against its zero-padded pair
        if (kp == full && k % 2 == 0) break;
        for (int64_t j = kp * per_step; j < (kp + 1) * per_step && j < fetch_lines; ++j)
            _mm_prefetch(fetch + j * 64, _MM_HINT_T0);
        __m512i w[NB];
        for (int b = 0; b < NB; ++b) w[b] = pair_weights(wp + b * block + kp * 32);
        for (int m = 0; m < M; ++m) {
            const uint16_t* xp = x + m * x_stride + 2 * kp;
            const PairX px = kp < full ? pair_x(xp) : pair_x_last(xp);
            for (int b = 0; b < NB; ++b) acc[b][m] = pair_fma(acc[b][m], px, w[b]);
        }
    }
    for (int b = 0; b < NB; ++b) {
        const __m512 bv = bias ? load_full16(bias + 16 * b) : _mm512_setzero_ps();
        for (int m = 0; m < M; ++m) store_full16(y + m * y_stride + 16 * b, _mm512_add_ps(acc[b][m], bv));
    }
}

template <int NB>
void pair_rows(const uint16_t* x, int64_t x_stride, int64_t rows, int64_t k, const uint16_t* wp, const uint16_t* bias,
               uint16_t* y, int64_t y_stride, const uint16_t* next, int64_t next_outputs) {
    const int64_t lines = next ? next_outputs * pair_count(k) * 4 / 64 : 0;  // 2 inputs x 2 bytes per output
    for (int64_t r = 0; r < rows; r += 8)
        with_count(rows - r >= 8 ? 8 : rows - r, [&](auto m) {
            const FetchShare f = fetch_share(lines, rows, r);
            pair_tile<decltype(m)::value, NB>(x + r * x_stride, x_stride, k, wp, bias, y + r * y_stride, y_stride,
                                              reinterpret_cast<const char*>(next) + f.first * 64, f.last - f.first);
        });
}

void pair_linear_all(const uint16_t* x, const uint16_t* packed, const uint16_t* bias, uint16_t* y, int64_t rows,
                     int64_t n, int64_t k, int threads) {
    for_units(rows, n, threads, [&](int64_t r0, int64_t block, int64_t n0, bool two) {
        const uint16_t* wp = packed + n0 * pair_count(k) * 2;  // block n0/16 starts at (n0 / 16) * pairs * 32
        const uint16_t* b = bias ? bias + n0 : nullptr;
        const int64_t next_outputs = std::min<int64_t>(n - n0 - 32, 32);  // as linear_all
        const uint16_t* next = next_outputs > 0 ? wp + 32 * pair_count(k) * 2 : nullptr;
        if (two)
            pair_rows<2>(x + r0 * k, k, block, k, wp, b, y + r0 * n + n0, n, next, next_outputs);
        else
            pair_rows<1>(x + r0 * k, k, block, k, wp, b, y + r0 * n + n0, n, next, next_outputs);
    });
}

template <int G>
inline void pair_gemv_group(const uint16_t* x, int64_t k, const uint16_t* wp, const uint16_t* bias, uint16_t* y) {
    __m512 acc[G];
    for (int b = 0; b < G; ++b) acc[b] = _mm512_setzero_ps();
    const int64_t block = pair_count(k) * 32, full = k / 2;
    for (int64_t kp = 0; kp < full; ++kp) {
        const PairX px = pair_x(x + 2 * kp);
        for (int b = 0; b < G; ++b) acc[b] = pair_fma(acc[b], px, pair_weights(wp + b * block + kp * 32));
    }
    if (k % 2) {  // as pair_tile
        const PairX px = pair_x_last(x + k - 1);
        for (int b = 0; b < G; ++b) acc[b] = pair_fma(acc[b], px, pair_weights(wp + b * block + full * 32));
    }
    for (int b = 0; b < G; ++b) {
        const __m512 bv = bias ? load_full16(bias + 16 * b) : _mm512_setzero_ps();
        store_full16(y + 16 * b, _mm512_add_ps(acc[b], bv));
    }
}

void pair_gemv_all(const uint16_t* x, const uint16_t* packed, const uint16_t* bias, uint16_t* y, int64_t n, int64_t k,
                   int threads) {
    for_groups(n, threads, [&](int64_t b, int64_t g) {
        with_count(g, [&](auto c) {
            pair_gemv_group<decltype(c)::value>(x, k, packed + b * pair_count(k) * 32, bias ? bias + b * 16 : nullptr,
                                                y + b * 16);
        });
    });
}

template <typename T>
void apply_linear(const LinearRef& lin, const T* x, T* y, int64_t rows, int threads) {
    const T* bias = static_cast<const T*>(lin.bias);
    if constexpr (!std::is_same_v<T, float>) {  // bf16: the weights in pairs (provmark_pack_linear)
        const uint16_t* w = static_cast<const uint16_t*>(lin.packed);
        if (rows <= lin.gemv_rows) pair_gemv_all(x, w, bias, y, lin.n, lin.k, threads);
        else pair_linear_all(x, w, bias, y, rows, lin.n, lin.k, threads);
    } else if (lin.scales) {
        const int8_t* w = static_cast<const int8_t*>(lin.packed);
        if (rows <= lin.gemv_rows) gemv_all(x, w, lin.scales, bias, y, lin.n, lin.k, threads);
        else linear_all(x, lin.k, w, lin.scales, bias, y, rows, lin.n, lin.k, threads);
    } else {
        if (rows <= lin.gemv_rows) gemv_all(x, static_cast<const float*>(lin.packed), static_cast<const float*>(nullptr), bias,
                                            y, lin.n, lin.k, threads);
        else linear_all(x, lin.k, static_cast<const float*>(lin.packed), static_cast<const float*>(nullptr), bias, y, rows,
                        lin.n, lin.k, threads);
    }
}
#endif
// One row's span [v0, v1) of the watermark bias. H = 0: one seed for the row (``seed``); H > 0: selfhash
// over an H-token context (unrolled); H = -1: selfhash with ``seed`` as the context length.
template <int H>
void bias_span(float* row, int64_t v0, int64_t v1, int64_t seed, const int64_t* c, const int64_t* salt,
               const int64_t* own, const int64_t* mix, uint64_t mult, int64_t threshold, float delta, int hard) {
#pragma omp simd
    for (int64_t v = v0; v < v1; ++v) {
        int64_t sd;
        if constexpr (H == 0) {
            sd = seed;
        } else if constexpr (H > 0) {
            sd = own[v];
            for (int j = 0; j < H; ++j) {
                const int64_t candidate = c[j] ^ salt[v];
                sd = candidate < sd ? candidate : sd;
            }
        } else {
            sd = own[v];
            for (int64_t j = 0; j < seed; ++j) {
                const int64_t candidate = c[j] ^ salt[v];
                sd = candidate < sd ? candidate : sd;
            }
        }
        const uint64_t u = static_cast<uint64_t>(sd);
        const int64_t mixed = static_cast<int64_t>((u ^ static_cast<uint64_t>(mix[v])) * ((u * mult) | 1u));
        if (hard)
            row[v] = mixed < threshold ? row[v] : -INFINITY;
        else
            row[v] = row[v] + (mixed < threshold ? delta : 0.0f);  // as torch's add_(flags, alpha=delta)
    }
}

}  // namespace

extern "C" {

// The watermark bias over fp32 logits [rows, vocab] (watermark/greenlist.py's bias_logits, same integers):
// token v of row b is green when mix64(seed, mix[v]) < threshold, mix64(s, t) = (s ^ t) * ((s * M) | 1) in
// wrapping 64-bit arithmetic. The seed is per row (mode 0: row_seeds[b]) or, for selfhash (mode 1),
// min(own[v], min_j ctx[b, j] ^ salt[v]) as signed 64-bit values. Soft: green logits += delta; hard: red
// logits = -inf. ``row_deltas`` (or null: ``delta`` for every row) gives each row its own soft delta.
int provmark_watermark_bias(float* logits, int64_t rows, int64_t vocab, int mode, const int64_t* row_seeds,
                            const int64_t* ctx, int64_t h, const int64_t* salt, const int64_t* own,
                            const int64_t* mix, int64_t multiplier, int64_t threshold, float delta,
                            const float* row_deltas, int hard, int threads) {
    if (rows < 0 || vocab < 1 || (mode != 0 && mode != 1) || (mode == 1 && h < 0) || threads < 1) return -1;
    constexpr int64_t chunk = 4096;
    const int64_t chunks = (vocab + chunk - 1) / chunk;
    const uint64_t mult = static_cast<uint64_t>(multiplier);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t item = 0; item < rows * chunks; ++item) {
        const int64_t b = item / chunks, v0 = (item % chunks) * chunk, v1 = v0 + chunk < vocab ? v0 + chunk : vocab;
        float* row = logits + b * vocab;
        const int64_t* c = ctx + b * h;
        const float d = row_deltas ? row_deltas[b] : delta;
        if (mode == 0) {
            bias_span<0>(row, v0, v1, row_seeds[b], c, nullptr, nullptr, mix, mult, threshold, d, hard);
        } else {
            switch (h) {
#define PROVMARK_H(H) \
    case H: bias_span<H>(row, v0, v1, 0, c, salt, own, mix, mult, threshold, d, hard); break;
                PROVMARK_H(1) PROVMARK_H(2) PROVMARK_H(3) PROVMARK_H(4) PROVMARK_H(5) PROVMARK_H(6)
                PROVMARK_H(7) PROVMARK_H(8)
#undef PROVMARK_H
                default: bias_span<-1>(row, v0, v1, h, c, salt, own, mix, mult, threshold, d, hard);
            }
        }
    }
    return 0;
}

// W [n, k] (row stride w_stride) -> packed [n/16][k][16] for provmark_linear (n % 16 == 0); dtype 0 = float32,
// 2 = int8 (provmark_linear_q8); 1 = bfloat16 in pairs, [n/16][(k+1)/2][16][2] (an odd k's last pair padded
// with zeros: n * (k + 1) values; see pair_tile).
int provmark_pack_linear(int dtype, const void* w, int64_t w_stride, void* packed, int64_t n, int64_t k) {
    if (n < 16 || n % 16 != 0 || k < 1 || dtype < 0 || dtype > 2) return -1;
    if (dtype == 1) {
        const uint16_t* src = static_cast<const uint16_t*>(w);
        uint16_t* dst = static_cast<uint16_t*>(packed);
        const int64_t pairs = pair_count(k);
#pragma omp parallel for schedule(static)
        for (int64_t blk = 0; blk < n / 16; ++blk)
            for (int64_t kp = 0; kp < pairs; ++kp)
                for (int64_t lane = 0; lane < 16; ++lane)
                    for (int64_t half = 0; half < 2; ++half)
                        dst[((blk * pairs + kp) * 16 + lane) * 2 + half] =
                            2 * kp + half < k ? src[(blk * 16 + lane) * w_stride + 2 * kp + half] : uint16_t{0};
        return 0;
    }
    const size_t size = dtype == 0 ? 4 : dtype == 1 ? 2 : 1;
    const char* src = static_cast<const char*>(w);
    char* dst = static_cast<char*>(packed);
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < n / 16; ++blk)
        for (int64_t kk = 0; kk < k; ++kk)
            for (int64_t lane = 0; lane < 16; ++lane)
                std::memcpy(dst + ((blk * k + kk) * 16 + lane) * size, src + ((blk * 16 + lane) * w_stride + kk) * size, size);
    return 0;
}

// y [rows, n] (contiguous) = x [rows, k] (contiguous) W^T + bias ([n] or null), all of one dtype, W packed by
// provmark_pack_linear. Returns -1 where this build has no AVX-512 or the shapes do not fit.
int provmark_linear(int dtype, const void* x, const void* packed, const void* bias, void* y, int64_t rows, int64_t n,
                    int64_t k, int threads) {
#if defined(__AVX512F__)
    if (rows < 1 || n < 16 || n % 16 != 0 || k < 1 || threads < 1) return -1;
    if (dtype == 0) {
        linear_all(static_cast<const float*>(x), k, static_cast<const float*>(packed), nullptr, static_cast<const float*>(bias),
                   static_cast<float*>(y), rows, n, k, threads);
    } else if (dtype == 1) {
        pair_linear_all(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(packed),
                        static_cast<const uint16_t*>(bias), static_cast<uint16_t*>(y), rows, n, k, threads);
    } else {
        return -1;
    }
    return 0;
#else
    (void)dtype; (void)x; (void)packed; (void)bias; (void)y; (void)rows; (void)n; (void)k; (void)threads;
    return -1;
#endif
}

// y [n] = x [k] W^T + bias for one row (``provmark_linear`` at rows = 1, the same results bit for bit), W packed
// by provmark_pack_linear: the batch-1 decode step's linears. Returns -1 where this build has no AVX-512 or the
// shapes do not fit.
int provmark_gemv(int dtype, const void* x, const void* packed, const void* bias, void* y, int64_t n, int64_t k,
                  int threads) {
#if defined(__AVX512F__)
    if (n < 16 || n % 16 != 0 || k < 1 || threads < 1) return -1;
    if (dtype == 0) {
        gemv_all(static_cast<const float*>(x), static_cast<const float*>(packed), nullptr, static_cast<const float*>(bias),
                 static_cast<float*>(y), n, k, threads);
    } else if (dtype == 1) {
        pair_gemv_all(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(packed),
                      static_cast<const uint16_t*>(bias), static_cast<uint16_t*>(y), n, k, threads);
    } else {
        return -1;
    }
    return 0;
#else
    (void)dtype; (void)x; (void)packed; (void)bias; (void)y; (void)n; (void)k; (void)threads;
    return -1;
#endif
}

// The opt-in int8 weights: y [rows, n] = scale * (x [rows, k] Q^T) + bias in float32, Q int8 packed by
// provmark_pack_linear (dtype 2), scale [n] one float32 per output. Widened to fp32 in registers (exact),
// summed as provmark_linear sums, the scale applied once per output; rows == 1 runs the 1-row kernel (the
// same bits). Returns -1 where this build has no AVX-512 or the shapes do not fit.
int provmark_linear_q8(const float* x, const int8_t* packed, const float* scale, const float* bias, float* y,
                       int64_t rows, int64_t n, int64_t k, int threads) {
#if defined(__AVX512F__)
    if (rows < 1 || n < 16 || n % 16 != 0 || k < 1 || threads < 1 || !scale) return -1;
    apply_linear<float>(LinearRef{packed, scale, bias, n, k, 1}, x, y, rows, threads);
    return 0;
#else
    (void)x; (void)packed; (void)scale; (void)bias; (void)y; (void)rows; (void)n; (void)k; (void)threads;
    return -1;
#endif
}

// One decode step of a Llama-style attention block after its fused q/k/v projection: rotary embedding of
// q and k, k and v written into the slot cache at each row's position, attention of each row over its
// positions[b] + 1 cached keys. qkv [batch, (heads + 2 kv_heads) * dim] (q, then k, then v; row stride
// qkv_sb); cos/sin [batch, dim] (row stride cs_sb); keys/values [slots, kv_heads, max_len, dim] (strides
// c_sb, c_sh, c_st); out contiguous [batch, heads * dim]. Returns -1 (nothing written) for bad arguments.
int provmark_rope_cache_attention(int dtype, const void* qkv, int64_t qkv_sb, const void* cos, const void* sin,
                                  int64_t cs_sb, void* keys, void* values, int64_t c_sb, int64_t c_sh,
                                  int64_t c_st, int64_t max_len, const int64_t* positions, void* out,
                                  int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim, float scale,
                                  int threads) {
    if (batch < 1 || kv_heads < 1 || heads % kv_heads != 0 || dim < 2 || dim % 2 != 0 || threads < 1) return -1;
    std::vector<int64_t> lengths(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
        if (positions[b] < 0 || positions[b] >= max_len) return -1;
        lengths[static_cast<size_t>(b)] = positions[b] + 1;
    }
    auto prepare = [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        const T* src = static_cast<const T*>(qkv);
        const T* c = static_cast<const T*>(cos);
        const T* s = static_cast<const T*>(sin);
        T* k = static_cast<T*>(keys);
        T* v = static_cast<T*>(values);
        std::vector<T> q(static_cast<size_t>(batch * heads * dim));
        for (int64_t b = 0; b < batch; ++b) {
            const T* row = src + b * qkv_sb;
            const T* cb = c + b * cs_sb;
            const T* sb = s + b * cs_sb;
            for (int64_t h = 0; h < heads; ++h) rope_head(row + h * dim, cb, sb, q.data() + (b * heads + h) * dim, dim);
            for (int64_t h = 0; h < kv_heads; ++h) {
                const int64_t at = b * c_sb + h * c_sh + positions[b] * c_st;
                rope_head(row + (heads + h) * dim, cb, sb, k + at, dim);
                std::memcpy(v + at, row + (heads + kv_heads + h) * dim, static_cast<size_t>(dim) * sizeof(T));
            }
        }
        run<T>(q.data(), heads * dim, dim, k, v, c_sb, c_sh, c_st, lengths.data(), out, batch, heads, kv_heads,
               dim, scale, threads);
    };
    if (dtype == 0)
        prepare(static_cast<float*>(nullptr));
    else if (dtype == 1)
        prepare(static_cast<uint16_t*>(nullptr));
    else
        return -1;
    return 0;
}


// The paged cache's decode step (generation/kv_cache.py): provmark_rope_cache_attention's work, with row
// b's position p at row p & (2**shift - 1) of block tables[b * table_stride + (p >> shift)] of keys/values
// [num_blocks, kv_heads, 2**shift, dim] (strides c_sb, c_sh, c_st). The same arithmetic in the same order
// as the slot version: only the addresses differ. Returns -1 (nothing written) for bad arguments.
int provmark_paged_rope_cache_attention(int dtype, const void* qkv, int64_t qkv_sb, const void* cos,
                                        const void* sin, int64_t cs_sb, void* keys, void* values, int64_t c_sb,
                                        int64_t c_sh, int64_t c_st, int64_t shift, int64_t num_blocks,
                                        const int64_t* tables, int64_t table_stride, const int64_t* positions,
                                        void* out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                                        float scale, int threads) {
    if (batch < 1 || kv_heads < 1 || heads % kv_heads != 0 || dim < 2 || dim % 2 != 0 || threads < 1) return -1;
    std::vector<int64_t> lengths(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) lengths[static_cast<size_t>(b)] = positions[b] + 1;
    if (!tables_ok(tables, table_stride, shift, num_blocks, lengths.data(), batch)) return -1;
    const int64_t mask = (int64_t{1} << shift) - 1;
    auto prepare = [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        const T* src = static_cast<const T*>(qkv);
        const T* c = static_cast<const T*>(cos);
        const T* s = static_cast<const T*>(sin);
        T* k = static_cast<T*>(keys);
        T* v = static_cast<T*>(values);
        std::vector<T> q(static_cast<size_t>(batch * heads * dim));
        for (int64_t b = 0; b < batch; ++b) {
            const T* row = src + b * qkv_sb;
            const T* cb = c + b * cs_sb;
            const T* sb = s + b * cs_sb;
            const int64_t p = positions[b];
            const int64_t base = tables[b * table_stride + (p >> shift)] * c_sb + (p & mask) * c_st;
            for (int64_t h = 0; h < heads; ++h) rope_head(row + h * dim, cb, sb, q.data() + (b * heads + h) * dim, dim);
            for (int64_t h = 0; h < kv_heads; ++h) {
                const int64_t at = base + h * c_sh;
                rope_head(row + (heads + h) * dim, cb, sb, k + at, dim);
                std::memcpy(v + at, row + (heads + kv_heads + h) * dim, static_cast<size_t>(dim) * sizeof(T));
            }
        }
        run_paged<T>(q.data(), heads * dim, dim, k, v, c_sb, c_sh, c_st, shift, tables, table_stride,
                     lengths.data(), out, batch, heads, kv_heads, dim, scale, threads);
    };
    if (dtype == 0)
        prepare(static_cast<float*>(nullptr));
    else if (dtype == 1)
        prepare(static_cast<uint16_t*>(nullptr));
    else
        return -1;
    return 0;
}

// provmark_decode_attention over the paged cache (layout as provmark_paged_rope_cache_attention).
int provmark_paged_decode_attention(int dtype, const void* query, int64_t q_sb, int64_t q_sh, const void* keys,
                                    const void* values, int64_t c_sb, int64_t c_sh, int64_t c_st, int64_t shift,
                                    int64_t num_blocks, const int64_t* tables, int64_t table_stride,
                                    const int64_t* lengths, void* output, int64_t batch, int64_t heads,
                                    int64_t kv_heads, int64_t dim, float scale, int threads) {
    if (batch < 0 || kv_heads < 1 || heads % kv_heads != 0 || dim < 1 || threads < 1) return -1;
    if (!tables_ok(tables, table_stride, shift, num_blocks, lengths, batch)) return -1;
    if (dtype == 0)
        run_paged<float>(query, q_sb, q_sh, keys, values, c_sb, c_sh, c_st, shift, tables, table_stride, lengths,
                         output, batch, heads, kv_heads, dim, scale, threads);
    else if (dtype == 1)
        run_paged<uint16_t>(query, q_sb, q_sh, keys, values, c_sb, c_sh, c_st, shift, tables, table_stride, lengths,
                            output, batch, heads, kv_heads, dim, scale, threads);
    else
        return -1;
    return 0;
}

// Row b's new key/value ([batch, kv_heads, 1, dim], strides k_sb, k_sh / v_sb, v_sh) written at its
// position positions[b] of the paged cache (layout as provmark_paged_rope_cache_attention).
int provmark_paged_cache_write(int dtype, void* keys, void* values, int64_t c_sb, int64_t c_sh, int64_t c_st,
                               int64_t shift, int64_t num_blocks, const int64_t* tables, int64_t table_stride,
                               const void* new_k, int64_t k_sb, int64_t k_sh, const void* new_v, int64_t v_sb,
                               int64_t v_sh, const int64_t* positions, int64_t batch, int64_t kv_heads, int64_t dim) {
    if (batch < 0 || kv_heads < 1 || dim < 1) return -1;
    std::vector<int64_t> lengths(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) lengths[static_cast<size_t>(b)] = positions[b] + 1;
    if (!tables_ok(tables, table_stride, shift, num_blocks, lengths.data(), batch)) return -1;
    const int64_t mask = (int64_t{1} << shift) - 1;
    const size_t size = static_cast<size_t>(dim) * (dtype == 0 ? 4 : 2);
    if (dtype != 0 && dtype != 1) return -1;
    char* kc = static_cast<char*>(keys);
    char* vc = static_cast<char*>(values);
    const char* nk = static_cast<const char*>(new_k);
    const char* nv = static_cast<const char*>(new_v);
    const int64_t elem = dtype == 0 ? 4 : 2;
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t p = positions[b];
        const int64_t base = tables[b * table_stride + (p >> shift)] * c_sb + (p & mask) * c_st;
        for (int64_t h = 0; h < kv_heads; ++h) {
            std::memcpy(kc + (base + h * c_sh) * elem, nk + (b * k_sb + h * k_sh) * elem, size);
            std::memcpy(vc + (base + h * c_sh) * elem, nv + (b * v_sb + h * v_sh) * elem, size);
        }
    }
    return 0;
}

// x [rows, dim] (row stride x_stride, last dim contiguous), w [dim], out contiguous [rows, dim].
int provmark_rms_norm(int dtype, const void* x, int64_t x_stride, const void* w, float eps, void* out,
                      int64_t rows, int64_t dim) {
    if (rows < 0 || dim < 1) return -1;
    if (dtype == 0)
        rms_norm_rows(static_cast<const float*>(x), x_stride, static_cast<const float*>(w), eps, static_cast<float*>(out), rows, dim);
    else if (dtype == 1)
        rms_norm_rows(static_cast<const uint16_t*>(x), x_stride, static_cast<const uint16_t*>(w), eps,
                      static_cast<uint16_t*>(out), rows, dim);
    else
        return -1;
    return 0;
}

// gu [rows, 2 * inner] (gate then up, row stride gu_stride), out contiguous [rows, inner].
int provmark_silu_mul(int dtype, const void* gu, int64_t gu_stride, int64_t inner, void* out, int64_t rows) {
    if (rows < 0 || inner < 1) return -1;
    if (dtype == 0)
        silu_mul_rows(static_cast<const float*>(gu), gu_stride, inner, static_cast<float*>(out), rows);
    else if (dtype == 1)
        silu_mul_rows(static_cast<const uint16_t*>(gu), gu_stride, inner, static_cast<uint16_t*>(out), rows);
    else
        return -1;
    return 0;
}

// keys/values [slots, kv_heads, max_len, dim] (strides c_sb, c_sh, c_st, shared); new_k/new_v [batch,
// kv_heads, 1, dim] (strides k_sb, k_sh and v_sb, v_sh); row b writes at positions[b], each in 0..max_len-1.
int provmark_cache_write(int dtype, void* keys, void* values, int64_t c_sb, int64_t c_sh, int64_t c_st,
                         int64_t max_len, const void* new_k, int64_t k_sb, int64_t k_sh, const void* new_v,
                         int64_t v_sb, int64_t v_sh, const int64_t* positions, int64_t batch, int64_t kv_heads,
                         int64_t dim) {
    if (batch < 0 || kv_heads < 1 || dim < 1) return -1;
    for (int64_t b = 0; b < batch; ++b)
        if (positions[b] < 0 || positions[b] >= max_len) return -1;
    if (dtype == 0)
        cache_write_rows(static_cast<float*>(keys), static_cast<float*>(values), c_sb, c_sh, c_st,
                         static_cast<const float*>(new_k), k_sb, k_sh, static_cast<const float*>(new_v), v_sb, v_sh,
                         positions, batch, kv_heads, dim);
    else if (dtype == 1)
        cache_write_rows(static_cast<uint16_t*>(keys), static_cast<uint16_t*>(values), c_sb, c_sh, c_st,
                         static_cast<const uint16_t*>(new_k), k_sb, k_sh, static_cast<const uint16_t*>(new_v), v_sb,
                         v_sh, positions, batch, kv_heads, dim);
    else
        return -1;
    return 0;
}


// dtype: 0 = float32, 1 = bfloat16. Strides are in elements; the last dimension of every tensor is
// contiguous. query [batch, heads, dim] (strides q_sb, q_sh); keys/values [batch, kv_heads, >= max(lengths),
// dim] (strides kv_sb, kv_sh, kv_st, shared by both); lengths int64 [batch], each in 1..max_len (the keys'
// third dimension); output contiguous [batch, heads, dim]. Returns 0, or -1 (nothing read) for arguments
// the kernel cannot take.
int provmark_decode_attention(int dtype, const void* query, int64_t q_sb, int64_t q_sh, const void* keys,
                              const void* values, int64_t kv_sb, int64_t kv_sh, int64_t kv_st,
                              const int64_t* lengths, int64_t max_len, void* output, int64_t batch,
                              int64_t heads, int64_t kv_heads, int64_t dim, float scale, int threads) {
    if (batch < 0 || kv_heads < 1 || heads % kv_heads != 0 || dim < 1 || threads < 1) return -1;
    for (int64_t b = 0; b < batch; ++b)
        if (lengths[b] < 1 || lengths[b] > max_len) return -1;
    if (dtype == 0) {
        run<float>(query, q_sb, q_sh, keys, values, kv_sb, kv_sh, kv_st, lengths, output, batch, heads, kv_heads,
                   dim, scale, threads);
    } else if (dtype == 1) {
        run<uint16_t>(query, q_sb, q_sh, keys, values, kv_sb, kv_sh, kv_st, lengths, output, batch, heads,
                      kv_heads, dim, scale, threads);
    } else {
        return -1;
    }
    return 0;
}

// The Gumbel race's survivors (watermark/gumbel.py, GumbelWatermark.choose_from_probs): per row b, the
// reference token is the first most likely one, with E = -log r and bound = E / p * (1 + slack); token v
// can win only if 1 - r_v <= bound * p_v, with word = fmix64(mix64(seed[b], mix[v])) and 1 - r =
// ((~word >> 12) + 1/2) / 2**52 (watermark/keyed_words.py). The test here is on the top 31 bits of ~word
// (1 - r >= (~word >> 33) / 2**31), in float32 with the slack: a superset, vectorised on AVX2 too (no
// 64-bit integer to double conversion there); the caller scores the survivors exactly. Writes the first
// ``cap`` survivors of row b, ascending, to idx[b * cap ...] and their number to counts[b].
static inline void gumbel_keep_span(const float* __restrict p, const int64_t* __restrict mix, uint64_t s,
                                    uint64_t m, float scaled_bound, int64_t n, uint8_t* __restrict keep) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
        uint64_t x = (s ^ static_cast<uint64_t>(mix[j])) * m;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x = x ^ (x >> 31);
        const int32_t high = static_cast<int32_t>(~x >> 33);
        keep[j] = static_cast<float>(high) <= scaled_bound * p[j];
    }
}

int provmark_gumbel_survivors(const float* probs, int64_t rows, int64_t vocab, const int64_t* row_seeds,
                              const int64_t* mix, int64_t multiplier, double slack, int64_t cap, int64_t* idx,
                              int64_t* counts, int threads) {
    if (rows < 0 || vocab < 1 || cap < 1 || threads < 1) return -1;
    constexpr int64_t chunk = 4096;
    constexpr double two52 = 4503599627370496.0;
    const uint64_t mult = static_cast<uint64_t>(multiplier);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < rows; ++b) {
        const float* p = probs + b * vocab;
        const uint64_t s = static_cast<uint64_t>(row_seeds[b]);
        const uint64_t m = (s * mult) | 1u;
        float top = p[0];
#pragma omp simd reduction(max : top)
        for (int64_t v = 0; v < vocab; ++v) top = p[v] > top ? p[v] : top;
        int64_t best = 0;
        while (p[best] != top) ++best;
        uint64_t x = (s ^ static_cast<uint64_t>(mix[best])) * m;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x = x ^ (x >> 31);
        const double one_minus = (static_cast<double>(~x >> 12) + 0.5) / two52;
        const double bound = -std::log1p(-one_minus) / static_cast<double>(top) * (1.0 + slack);
        const float scaled = static_cast<float>(bound * 2147483648.0 * (1.0 + slack));  // x 2**31, float rounding
        int64_t count = 0;
        uint8_t keep[chunk];
        for (int64_t v0 = 0; v0 < vocab; v0 += chunk) {
            const int64_t n = v0 + chunk < vocab ? chunk : vocab - v0;
            gumbel_keep_span(p + v0, mix + v0, s, m, scaled, n, keep);
            for (int64_t j = 0; j < n; ++j) {
                if (keep[j]) {
                    if (count < cap) idx[b * cap + count] = v0 + j;
                    ++count;
                }
            }
        }
        counts[b] = count;
    }
    return 0;
}

// The top ``size`` values of each row with their column ids, descending, as torch.topk returns them, for
// rows whose top size + 1 values are distinct (then the answer is unique: torch.topk's own tie order,
// which follows its partial sort, never comes into it). ok[b] = 0, outputs unspecified, for any other row
// (ties, NaN, fewer than size + 1 columns): the caller runs torch.topk there. Per row: maxima of
// column chunks; th = the (size + 1)-th largest maximum, so at least size + 1 values are >= th and
// every such value lies in a chunk whose maximum is >= th; those chunks' values >= th are sorted.
int provmark_top_head(const float* scores, int64_t rows, int64_t vocab, int64_t stride, int64_t size,
                      float* values, int64_t* ids, uint8_t* ok, int threads) {
    if (rows < 0 || vocab < 1 || size < 1 || stride < vocab || threads < 1) return -1;
    // 64-column chunks (one cache line's worth of vectors), narrower for short rows: at least 2 (size + 1)
    const int64_t chunk = std::clamp<int64_t>(vocab / (2 * (size + 1)), 1, 64);
    const int64_t chunks = (vocab + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < rows; ++b) {
        const float* x = scores + b * stride;
        ok[b] = 0;
        if (chunks < size + 1) continue;
        std::vector<float> maxima(chunks);
        bool nan = false;
        for (int64_t c = 0; c < chunks; ++c) {
            const int64_t v0 = c * chunk, v1 = std::min(v0 + chunk, vocab);
            float top = x[v0];
            int odd = 0;  // an int sum, not a bool or: both reductions then vectorise
#pragma omp simd reduction(max : top) reduction(+ : odd)
            for (int64_t v = v0; v < v1; ++v) {
                top = x[v] > top ? x[v] : top;
                odd += x[v] != x[v];
            }
            maxima[c] = top;
            nan |= odd != 0;
        }
        if (nan) continue;  // torch.topk ranks NaN above everything
        std::vector<float> order(maxima);
        std::nth_element(order.begin(), order.begin() + size, order.end(), std::greater<float>());
        const float th = order[size];
        std::vector<std::pair<float, int64_t>> found;
        for (int64_t c = 0; c < chunks; ++c) {
            if (!(maxima[c] >= th)) continue;
            const int64_t v0 = c * chunk, v1 = std::min(v0 + chunk, vocab);
            for (int64_t v = v0; v < v1; ++v)
                if (x[v] >= th) found.emplace_back(x[v], v);
        }
        if (static_cast<int64_t>(found.size()) < size + 1) continue;
        std::partial_sort(found.begin(), found.begin() + size + 1, found.end(),
                          [](const auto& a, const auto& b) { return a.first > b.first; });
        bool distinct = true;
        for (int64_t j = 0; j < size; ++j) distinct &= found[j].first > found[j + 1].first;
        if (!distinct) continue;
        for (int64_t j = 0; j < size; ++j) {
            values[b * size + j] = found[j].first;
            ids[b * size + j] = found[j].second;
        }
        ok[b] = 1;
    }
    return 0;
}

// SynthID's tournament in place over rows of probabilities [rows, cols] (contiguous), layer d's g-value of
// column c being bit d of words[b, c]: per layer, mass = the probabilities of the row's g = 1 columns summed
// in column order in double and rounded to float (what torch.cumsum does on the CPU), then
// p <- p * ((1 + g) - mass) with each operation rounded to float, as the tensor definition
// (watermark/synthid.py, sequential_tournament) does. Adding 0.0 for g = 0 leaves the sum's bits alone and
// keeps the loop free of unpredictable branches. A head (tens of columns) takes one thread; whole rows
// of the vocabulary (top_k = 0) are spread over the threads, a row each.
int provmark_synthid_tournament(float* probs, int64_t rows, int64_t cols, const int64_t* words, int64_t layers,
                                int threads) {
    if (rows < 0 || cols < 0 || layers < 0 || layers > 64 || threads < 1) return -1;
#pragma omp parallel for schedule(static) num_threads(threads) if (cols * layers >= (1 << 16) && rows > 1)
    for (int64_t b = 0; b < rows; ++b) {
        float* p = probs + b * cols;
        const uint64_t* w = reinterpret_cast<const uint64_t*>(words) + b * cols;
        for (int64_t d = 0; d < layers; ++d) {
            double mass = 0.0;
            for (int64_t c = 0; c < cols; ++c) mass += ((w[c] >> d) & 1u) ? static_cast<double>(p[c]) : 0.0;
            const float rounded = static_cast<float>(mass);
            const float lose = 1.0f - rounded, win = 2.0f - rounded;
            for (int64_t c = 0; c < cols; ++c) p[c] = p[c] * (((w[c] >> d) & 1u) ? win : lose);
        }
        for (int64_t c = 0; c < cols; ++c) p[c] = p[c] < 0.0f ? 0.0f : p[c];  // a mass rounded above 1
    }
    return 0;
}


// A decode step of a Llama-style decoder's layers in one call, for rows whose every linear runs the kernels
// above: per layer RMSNorm, the fused q/k/v linear, provmark_paged_rope_cache_attention, o_proj and the
// residual add, RMSNorm, the fused gate/up linear, silu * up, down_proj and the residual add; then the final
// RMSNorm. The same kernels in the same order as generation/cpu/direct_decode.py's loop over the modules
// (the same bits), without a Python call or a tensor allocation between them. hidden [batch, dim_model] is
// updated in place; out [batch, dim_model] receives the final norm. Returns -1 (nothing reliable written)
// for bad arguments, a layer's index + 1 where its attention rejected a position.
struct DecodeLayer {
    LinearRef qkv, o, gate_up, down;
    const void* input_norm;
    const void* post_norm;
    void* keys;
    void* values;
};

}  // extern "C"

#if defined(__AVX512F__)
namespace {
template <typename T>
int decode_stack(const DecodeLayer* layers, int64_t n_layers, T* hidden, const T* final_norm, T* out, float eps,
                 int dtype, const T* cos, const T* sin, int64_t c_sb, int64_t c_sh, int64_t c_st, int64_t shift,
                 int64_t num_blocks, const int64_t* tables, int64_t table_stride, const int64_t* positions,
                 int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, float scale, int threads) {
    const int64_t d = layers[0].qkv.k, inner = layers[0].gate_up.n / 2;
    std::vector<T> normed(static_cast<size_t>(batch * d)), attn(static_cast<size_t>(batch * heads * head_dim)),
        act(static_cast<size_t>(batch * inner)), step(static_cast<size_t>(batch * d));
    std::vector<T> wide(static_cast<size_t>(batch * std::max(layers[0].qkv.n, layers[0].gate_up.n)));
    const int64_t nh = batch * d;
    for (int64_t i = 0; i < n_layers; ++i) {
        const DecodeLayer& layer = layers[i];
        rms_norm_rows(hidden, d, static_cast<const T*>(layer.input_norm), eps, normed.data(), batch, d);
        apply_linear<T>(layer.qkv, normed.data(), wide.data(), batch, threads);
        if (provmark_paged_rope_cache_attention(dtype, wide.data(), layer.qkv.n, cos, sin, head_dim, layer.keys,
                                                layer.values, c_sb, c_sh, c_st, shift, num_blocks, tables,
                                                table_stride, positions, attn.data(), batch, heads, kv_heads,
                                                head_dim, scale, threads) != 0)
            return static_cast<int>(i) + 1;
        apply_linear<T>(layer.o, attn.data(), step.data(), batch, threads);
        for (int64_t j = 0; j < nh; ++j) hidden[j] = from_float<T>(to_float(hidden[j]) + to_float(step[j]));
        rms_norm_rows(hidden, d, static_cast<const T*>(layer.post_norm), eps, normed.data(), batch, d);
        apply_linear<T>(layer.gate_up, normed.data(), wide.data(), batch, threads);
        silu_mul_rows(wide.data(), layer.gate_up.n, inner, act.data(), batch);
        apply_linear<T>(layer.down, act.data(), step.data(), batch, threads);
        for (int64_t j = 0; j < nh; ++j) hidden[j] = from_float<T>(to_float(hidden[j]) + to_float(step[j]));
    }
    rms_norm_rows(hidden, d, final_norm, eps, out, batch, d);
    return 0;
}
}  // namespace
#endif

extern "C" {

int provmark_decode_stack(int dtype, const DecodeLayer* layers, int64_t n_layers, void* hidden, const void* final_norm,
                          void* out, float eps, const void* cos, const void* sin, int64_t c_sb, int64_t c_sh,
                          int64_t c_st, int64_t shift, int64_t num_blocks, const int64_t* tables,
                          int64_t table_stride, const int64_t* positions, int64_t batch, int64_t heads,
                          int64_t kv_heads, int64_t head_dim, float scale, int threads) {
#if defined(__AVX512F__)
    if (n_layers < 1 || batch < 1 || threads < 1 || heads < 1 || kv_heads < 1 || head_dim < 2) return -1;
    const int64_t d = layers[0].qkv.k;
    for (int64_t i = 0; i < n_layers; ++i) {
        const DecodeLayer& l = layers[i];
        if (l.qkv.k != d || l.qkv.n != (heads + 2 * kv_heads) * head_dim || l.o.k != heads * head_dim || l.o.n != d
            || l.gate_up.k != d || l.gate_up.n % 2 != 0 || l.gate_up.n != layers[0].gate_up.n
            || l.down.k != l.gate_up.n / 2 || l.down.n != d || (dtype == 1 && (l.qkv.scales || l.o.scales
            || l.gate_up.scales || l.down.scales)))
            return -1;
    }
    if (dtype == 0)
        return decode_stack<float>(layers, n_layers, static_cast<float*>(hidden), static_cast<const float*>(final_norm),
                                   static_cast<float*>(out), eps, dtype, static_cast<const float*>(cos),
                                   static_cast<const float*>(sin), c_sb, c_sh, c_st, shift, num_blocks, tables,
                                   table_stride, positions, batch, heads, kv_heads, head_dim, scale, threads);
    if (dtype == 1)
        return decode_stack<uint16_t>(layers, n_layers, static_cast<uint16_t*>(hidden),
                                      static_cast<const uint16_t*>(final_norm), static_cast<uint16_t*>(out), eps,
                                      dtype, static_cast<const uint16_t*>(cos), static_cast<const uint16_t*>(sin),
                                      c_sb, c_sh, c_st, shift, num_blocks, tables, table_stride, positions, batch,
                                      heads, kv_heads, head_dim, scale, threads);
    return -1;
#else
    (void)dtype; (void)layers; (void)n_layers; (void)hidden; (void)final_norm; (void)out; (void)eps; (void)cos;
    (void)sin; (void)c_sb; (void)c_sh; (void)c_st; (void)shift; (void)num_blocks; (void)tables; (void)table_stride;
    (void)positions; (void)batch; (void)heads; (void)kv_heads; (void)head_dim; (void)scale; (void)threads;
    return -1;
#endif
}

}  // extern "C"
