// Linear layers over GGUF-quantized weights (Q4_0, Q4_1, Q8_0), read in their blocks.
//
// A GGUF weight row is a run of blocks of 32 weights along the input features:
//   Q4_0: fp16 scale d,              16 bytes of nibbles   w = d * (q - 8)
//   Q4_1: fp16 scale d, fp16 min m,  16 bytes of nibbles   w = d * q + m
//   Q8_0: fp16 scale d,              32 signed bytes       w = d * q
// (nibble j holds weight j in its low half and weight j + 16 in its high half).
//
// Decoding reads every weight once per step, so its cost is the bytes read: the
// weights stay in their 4.5 to 8.5 bits and are never widened in memory. As
// llama.cpp does, each row of x is quantized to 8 bits per block of 32 (scale
// max|x| / 127), so a block's dot product is 32 byte products summed in integers
// (AVX2 maddubs, or AVX-512 VNNI's dpbusd where present) and scaled once:
//   sum_j w_j x_j = d_w d_x sum_j q_j p_j  (+ m d_x sum_j p_j for Q4_1; - 8 d_w d_x sum_j p_j for Q4_0)
// The rounding of x is the only error beyond fp32's: at most max|x_block| / 254
// per element; at most max|x_block| / 64516 where the packed kernel rounds x in
// two parts (steps of few rows: ``kTwoPartRows``).
//
// Weights are also taken re-laid out (``pack_groups``), the same bytes in another
// order: per group of 8 output rows and block, the 8 scales (and Q4_1's 8 mins),
// then chunks of [8 rows][4 bytes]: Q4's four, chunk c holding each row's nibble
// bytes 4c..4c+3 (weights 4c..4c+3 low, 16+4c..16+4c+3 high); Q8_0's eight,
// chunk c holding weights 4c..4c+3. One 8-lane
// register then holds 4 weights of each of 8 rows: a dot-product instruction
// against 4 broadcast activation bytes advances all 8 rows at once, with no
// horizontal sums, so a block costs 8 such instructions per 8 rows instead of
// one plus a scale and a reduction per row. Long prefills instead de-quantize the weight (``dequantize``) and
// run the fast float matmul; the caller picks by row count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "dtypes.h"

namespace {

using genfleet::bf16;
using genfleet::store;
using genfleet::to_float;

constexpr int64_t kBlock = 32;
constexpr int kMaxRows = 4;  // rows of x per pass over a weight row: their accumulators stay in registers

// GGML's type ids, as GGUF files store them.
constexpr int32_t kQ4_0 = 2;
constexpr int32_t kQ4_1 = 3;
constexpr int32_t kQ8_0 = 8;

template <int32_t kType>
constexpr int64_t kBlockBytes = kType == kQ4_0 ? 18 : kType == kQ4_1 ? 20 : 34;

// One block of a row of x, quantized: x_j ~ d * q_j; ds = d * sum_j q_j.
struct ActivationBlock {
  float d;
  float ds;
  int8_t q[kBlock];
};

inline float half_to_float(const uint8_t* bytes) {
  uint16_t h;
  std::memcpy(&h, bytes, sizeof h);
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// One block of 32 values to 8 bits: q_j = round(v_j / d), d = max|v| / 127
// (rounding to nearest even, as lrint and cvtps do by default).
#ifdef __AVX2__
inline void quantize_block(const float* values, ActivationBlock& block) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(values + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 top = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  top = _mm_max_ps(top, _mm_movehl_ps(top, top));
  top = _mm_max_ss(top, _mm_movehdup_ps(top));
  const float d = _mm_cvtss_f32(top) / 127.f;
  const __m256 inverse = _mm256_set1_ps(d > 0.f ? 1.f / d : 0.f);
  __m256i q[4];
  __m256i sum = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));
    sum = _mm256_add_epi32(sum, q[i]);
  }
  // Packing works within 128-bit lanes: 4-byte runs come out as q0 q1 q2 q3 (first
  // halves), then the second halves; the permutation puts them in element order.
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                           _mm256_packs_epi32(q[2], q[3]));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(block.q),
                      _mm256_permutevar8x32_epi32(bytes, order));
  __m128i total = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  total = _mm_hadd_epi32(total, total);
  total = _mm_hadd_epi32(total, total);
  block.d = d;
  block.ds = d * float(_mm_cvtsi128_si32(total));
}
#else
inline void quantize_block(const float* values, ActivationBlock& block) {
  float amax = 0.f;
  for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(values[j]));
  const float d = amax / 127.f;
  const float inverse = d > 0.f ? 1.f / d : 0.f;
  int32_t sum = 0;
  for (int64_t j = 0; j < kBlock; ++j) {
    block.q[j] = int8_t(std::lrint(values[j] * inverse));
    sum += block.q[j];
  }
  block.d = d;
  block.ds = d * float(sum);
}
#endif

// Each row of x as ``parts`` rows of blocks: the row rounded to 8 bits per block, and
// with two parts, after it the first part's rounding error rounded the same way
// (x ~ d1 q1 + d2 q2): a dot product over both rows, summed, is then off by at most
// max|x_block| / 64516 per element (d2 <= d1 / 254) instead of max|x_block| / 254.
template <typename T>
void quantize_rows(const T* x, int64_t stride, int64_t rows, int64_t k, int64_t parts,
                   ActivationBlock* out) {
  const int64_t blocks = k / kBlock;
  float values[kBlock];
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t j = 0; j < kBlock; ++j) values[j] = to_float(x[m * stride + b * kBlock + j]);
      for (int64_t part = 0; part < parts; ++part) {
        ActivationBlock& block = out[(m * parts + part) * blocks + b];
        quantize_block(values, block);
        for (int64_t j = 0; j < kBlock; ++j) values[j] -= block.d * float(block.q[j]);
      }
    }
}

// What a block adds besides d_w d_x sum_j q_j p_j (the zero point of Q4_0, the min of Q4_1).
// Per block it is ``offset_scale * ds`` of the x block.
template <int32_t kType>
inline float offset_scale(const uint8_t* block, float d) {
  if constexpr (kType == kQ4_0) return -8.f * d;
  if constexpr (kType == kQ4_1) return half_to_float(block + 2);
  return 0.f;
}

#ifdef __AVX2__

// The block's 32 quantized weights as bytes in element order (Q4: 0..15; Q8_0: signed).
template <int32_t kType>
inline __m256i block_weights(const uint8_t* block) {
  if constexpr (kType == kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
  } else {
    const uint8_t* nibbles = block + (kType == kQ4_1 ? 4 : 2);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nibbles));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i low = _mm_and_si128(packed, mask);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    return _mm256_set_m128i(high, low);
  }
}

// Eight int32 partial sums of unsigned bytes u times signed bytes s.
inline __m256i dot_bytes(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  // Pairs of 4-bit * 8-bit, or |8-bit| * 8-bit, products never saturate int16.
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_hadd_ps(sum, sum);
  sum = _mm_hadd_ps(sum, sum);
  return _mm_cvtss_f32(sum);
}

// sums[m] = row . x[m] for kRows rows of x.
template <int32_t kType, int kRows>
void dot_rows(const uint8_t* row, const ActivationBlock* x, int64_t blocks, float* sums) {
  __m256 acc[kRows];
  float offsets[kRows] = {};
  for (int m = 0; m < kRows; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * kBlockBytes<kType>;
    const float d = half_to_float(block);
    const float offset = offset_scale<kType>(block, d);
    __m256i weights = block_weights<kType>(block);
    const __m256i signs = weights;
    if constexpr (kType == kQ8_0) weights = _mm256_sign_epi8(weights, weights);  // |q|
    for (int m = 0; m < kRows; ++m) {
      const ActivationBlock& xb = x[m * blocks + b];
      __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q));
      if constexpr (kType == kQ8_0) p = _mm256_sign_epi8(p, signs);  // q p = |q| (sign(q) p)
      const __m256 products = _mm256_cvtepi32_ps(dot_bytes(weights, p));
      acc[m] = _mm256_fmadd_ps(products, _mm256_set1_ps(d * xb.d), acc[m]);
      if constexpr (kType != kQ8_0) offsets[m] += offset * xb.ds;
    }
  }
  for (int m = 0; m < kRows; ++m) sums[m] = horizontal_sum(acc[m]) + offsets[m];
}

#else

template <int32_t kType>
inline int32_t block_weight(const uint8_t* block, int64_t j) {
  if constexpr (kType == kQ8_0) return int8_t(block[2 + j]);
  const uint8_t* nibbles = block + (kType == kQ4_1 ? 4 : 2);
  return j < 16 ? nibbles[j] & 0x0f : nibbles[j - 16] >> 4;
}

template <int32_t kType, int kRows>
void dot_rows(const uint8_t* row, const ActivationBlock* x, int64_t blocks, float* sums) {
  for (int m = 0; m < kRows; ++m) sums[m] = 0.f;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * kBlockBytes<kType>;
    const float d = half_to_float(block);
    const float offset = offset_scale<kType>(block, d);
    for (int m = 0; m < kRows; ++m) {
      const ActivationBlock& xb = x[m * blocks + b];
      int32_t products = 0;
      for (int64_t j = 0; j < kBlock; ++j) products += block_weight<kType>(block, j) * xb.q[j];
      sums[m] += d * xb.d * float(products) + offset * xb.ds;
    }
  }
}

#endif

template <int32_t kType>
using DotRows = void (*)(const uint8_t*, const ActivationBlock*, int64_t, float*);

template <int32_t kType>
constexpr DotRows<kType> kDotRows[kMaxRows + 1] = {nullptr, dot_rows<kType, 1>, dot_rows<kType, 2>,
                                                   dot_rows<kType, 3>, dot_rows<kType, 4>};

template <int32_t kType, typename T>
void linear(const T* x, int64_t x_stride, int64_t rows, const uint8_t* weight, const T* bias,
            int64_t n, int64_t k, T* y) {
  const int64_t blocks = k / kBlock;
  std::vector<ActivationBlock> quantized(size_t(rows * blocks));
  quantize_rows(x, x_stride, rows, k, 1, quantized.data());
  const int64_t row_bytes = blocks * kBlockBytes<kType>;
  // Output features are split across threads: each streams its share of the weight once.
#pragma omp parallel for schedule(static)
  for (int64_t out = 0; out < n; ++out) {
    const uint8_t* row = weight + out * row_bytes;
    const float b = bias ? to_float(bias[out]) : 0.f;
    float sums[kMaxRows];
    for (int64_t first = 0; first < rows; first += kMaxRows) {
      const int64_t count = std::min<int64_t>(kMaxRows, rows - first);
      kDotRows<kType>[count](row, quantized.data() + first * blocks, blocks, sums);
      for (int64_t m = 0; m < count; ++m) store(sums[m] + b, y + (first + m) * n + out);
    }
  }
}

#ifdef __AVX2__

inline void store8(__m256 values, float* out) { _mm256_storeu_ps(out, values); }

inline void store8(__m256 values, bf16* out) {
  // Round to nearest even, as genfleet::store does (weights are finite: no NaN case).
  const __m256i bits = _mm256_castps_si256(values);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(rounded),
                                          _mm256_extracti128_si256(rounded, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed);
}

// The 32 weights of one block, as the reference computes them: d * (q - zero) (+ min).
template <int32_t kType, typename T>
inline void dequantize_block(const uint8_t* block, T* values) {
  const __m256 d = _mm256_set1_ps(half_to_float(block));
  const __m256 low = _mm256_set1_ps(kType == kQ4_1 ? half_to_float(block + 2) : 0.f);
  const __m256i zero = _mm256_set1_epi32(kType == kQ4_0 ? 8 : 0);
  alignas(32) uint8_t bytes[kBlock];
  _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), block_weights<kType>(block));
  for (int64_t j = 0; j < kBlock; j += 8) {
    const __m128i eight = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + j));
    const __m256i q = kType == kQ8_0 ? _mm256_cvtepi8_epi32(eight) : _mm256_cvtepu8_epi32(eight);
    __m256 value = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, zero)));
    if constexpr (kType == kQ4_1) value = _mm256_add_ps(value, low);
    store8(value, values + j);
  }
}

#else

template <int32_t kType, typename T>
inline void dequantize_block(const uint8_t* block, T* values) {
  const float d = half_to_float(block);
  const float low = kType == kQ4_1 ? half_to_float(block + 2) : 0.f;
  const int32_t zero = kType == kQ4_0 ? 8 : 0;
  for (int64_t j = 0; j < kBlock; ++j)
    store(d * float(block_weight<kType>(block, j) - zero) + low, values + j);
}

#endif

template <int32_t kType, typename T>
void dequantize(const uint8_t* weight, int64_t n, int64_t k, T* out) {
  const int64_t blocks = k / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < n; ++row)
    for (int64_t b = 0; b < blocks; ++b)
      dequantize_block<kType>(weight + (row * blocks + b) * kBlockBytes<kType>,
                              out + row * k + b * kBlock);
}

// ---- Q4_0 / Q4_1 in groups of 8 rows ----

constexpr int64_t kGroupRows = 8;
// Rows of x per pass over a group: 8 keeps a verifying step's few tokens (speculative
// decoding) in one pass where AVX-512's 32 registers hold their sums; 4 on AVX2's 16.
#ifdef __AVX512F__
constexpr int kMaxGroupRows = 8;
#else
constexpr int kMaxGroupRows = 4;
#endif

template <int32_t kType>
constexpr int64_t kScaleBytes = kType == kQ4_1 ? 32 : 16;  // 8 fp16 scales (+ 8 fp16 mins)

// Chunks of [8 rows][4 bytes] per group and block: Q4's 4 (two weights a byte), Q8_0's 8.
template <int32_t kType>
constexpr int kChunks = kType == kQ8_0 ? 8 : 4;

template <int32_t kType>
constexpr int64_t kGroupBlockBytes = kGroupRows * kBlockBytes<kType>;

template <int32_t kType>
void pack_groups(const uint8_t* weight, int64_t n, int64_t k, uint8_t* packed) {
  const int64_t blocks = k / kBlock;
  const int64_t groups = (n + kGroupRows - 1) / kGroupRows;
  const int64_t values = kType == kQ4_1 ? 4 : 2;  // where the block's weights start
  std::memset(packed, 0, size_t(groups * blocks * kGroupBlockBytes<kType>));  // missing rows: 0
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* dst = packed + (g * blocks + b) * kGroupBlockBytes<kType>;
      for (int64_t r = 0; r < kGroupRows && g * kGroupRows + r < n; ++r) {
        const uint8_t* src = weight + ((g * kGroupRows + r) * blocks + b) * kBlockBytes<kType>;
        std::memcpy(dst + 2 * r, src, 2);
        if (kType == kQ4_1) std::memcpy(dst + 16 + 2 * r, src + 2, 2);
        for (int64_t c = 0; c < kChunks<kType>; ++c)
          std::memcpy(dst + kScaleBytes<kType> + c * 32 + r * 4, src + values + 4 * c, 4);
      }
    }
}

#ifdef __AVX2__

// acc + the sums of 4 products of unsigned bytes u and signed bytes s, per int32 lane.
inline __m256i dot_accumulate(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// Per row of a group (int32 lane), its 32 4-bit weights (``low``, ``high``: chunks of
// nibbles) times one x block's 32 bytes (``quads``: 4 at a time).
inline __m256i q4_block_products(const __m256i low[4], const __m256i high[4],
                                 const int32_t quads[8]) {
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
  __m256i products = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    products = dot_accumulate(products, low[c], _mm256_set1_epi32(quads[c]));
    products = dot_accumulate(products, high[c], _mm256_set1_epi32(quads[c + 4]));
  }
  return products;
#else
  // Without VNNI, products come in int16 pairs; 4-bit weights keep the sum of all 8
  // chunks' pairs within int16 (8 * 2 * 15 * 127 = 30480), so they are added as int16
  // and widened once instead of once a chunk.
  __m256i pairs = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(low[c], _mm256_set1_epi32(quads[c])));
    pairs = _mm256_add_epi16(pairs,
                             _mm256_maddubs_epi16(high[c], _mm256_set1_epi32(quads[c + 4])));
  }
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

// sums[m][r] = row r of the group . x[m], for kRows rows of x.
template <int32_t kType, int kRows>
void group_dot(const uint8_t* group, const ActivationBlock* x, int64_t blocks,
               float sums[][kGroupRows]) {
  __m256 acc[kRows], offsets[kRows];
  for (int m = 0; m < kRows; ++m) acc[m] = offsets[m] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = group + b * kGroupBlockBytes<kType>;
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
    if constexpr (kType == kQ8_0) {
      // Signed weights: |w| times x with w's sign (pairs stay within int16).
      __m256i signs[8], magnitudes[8];
      for (int c = 0; c < 8; ++c) {
        signs[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16 + 32 * c));
        magnitudes[c] = _mm256_sign_epi8(signs[c], signs[c]);
      }
      for (int m = 0; m < kRows; ++m) {
        const ActivationBlock& xb = x[m * blocks + b];
        int32_t quads[8];
        std::memcpy(quads, xb.q, sizeof quads);
        __m256i products = _mm256_setzero_si256();
        for (int c = 0; c < 8; ++c)
          products = dot_accumulate(
              products, magnitudes[c], _mm256_sign_epi8(_mm256_set1_epi32(quads[c]), signs[c]));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products),
                                 _mm256_mul_ps(d, _mm256_set1_ps(xb.d)), acc[m]);
      }
      continue;
    }
    // What multiplies each x block's ds: Q4_1's mins, Q4_0's -8 d.
    const __m256 offset =
        kType == kQ4_1
            ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16)))
            : _mm256_mul_ps(d, _mm256_set1_ps(-8.f));
    __m256i low[4], high[4];
    for (int c = 0; c < 4; ++c) {
      const __m256i bytes = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(block + kScaleBytes<kType> + 32 * c));
      low[c] = _mm256_and_si256(bytes, mask);
      high[c] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
    }
    for (int m = 0; m < kRows; ++m) {
      const ActivationBlock& xb = x[m * blocks + b];
      int32_t quads[8];
      std::memcpy(quads, xb.q, sizeof quads);
      const __m256i products = q4_block_products(low, high, quads);
      const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(xb.d));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), scale, acc[m]);
      offsets[m] = _mm256_fmadd_ps(offset, _mm256_set1_ps(xb.ds), offsets[m]);
    }
  }
  for (int m = 0; m < kRows; ++m) _mm256_storeu_ps(sums[m], _mm256_add_ps(acc[m], offsets[m]));
}

#else

template <int32_t kType, int kRows>
void group_dot(const uint8_t* group, const ActivationBlock* x, int64_t blocks,
               float sums[][kGroupRows]) {
  for (int m = 0; m < kRows; ++m)
    for (int64_t r = 0; r < kGroupRows; ++r) sums[m][r] = 0.f;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = group + b * kGroupBlockBytes<kType>;
    for (int64_t r = 0; r < kGroupRows; ++r) {
      const float d = half_to_float(block + 2 * r);
      const float offset = kType == kQ4_1   ? half_to_float(block + 16 + 2 * r)
                           : kType == kQ4_0 ? -8.f * d
                                            : 0.f;
      for (int m = 0; m < kRows; ++m) {
        const ActivationBlock& xb = x[m * blocks + b];
        int32_t products = 0;
        for (int64_t c = 0; c < kChunks<kType>; ++c)
          for (int64_t i = 0; i < 4; ++i) {
            const uint8_t byte = block[kScaleBytes<kType> + c * 32 + r * 4 + i];
            if constexpr (kType == kQ8_0)
              products += int8_t(byte) * xb.q[4 * c + i];
            else
              products += (byte & 0x0f) * xb.q[4 * c + i] + (byte >> 4) * xb.q[16 + 4 * c + i];
          }
        sums[m][r] += d * xb.d * float(products) + offset * xb.ds;
      }
    }
  }
}

#endif

template <int32_t kType>
using GroupDot = void (*)(const uint8_t*, const ActivationBlock*, int64_t, float[][kGroupRows]);

template <int32_t kType>
constexpr GroupDot<kType> kGroupDots[9] = {
    nullptr,             group_dot<kType, 1>, group_dot<kType, 2>, group_dot<kType, 3>,
    group_dot<kType, 4>, group_dot<kType, 5>, group_dot<kType, 6>, group_dot<kType, 7>,
    group_dot<kType, 8>};

// Steps of at most this many rows quantize x in two parts (``quantize_rows``): there
// the bus bounds the step, not the arithmetic, and both parts of every row still fit
// one pass over the weight. Batch 1 then rounds x to about 16 bits, finer than bf16.
constexpr int64_t kTwoPartRows = kMaxGroupRows / 2;

template <int32_t kType, typename T>
void packed_linear(const T* x, int64_t x_stride, int64_t rows, const uint8_t* packed,
                   const T* bias, int64_t n, int64_t k, T* y) {
  const int64_t blocks = k / kBlock;
  const int64_t parts = rows <= kTwoPartRows ? 2 : 1;
  std::vector<ActivationBlock> quantized(size_t(rows * parts * blocks));
  quantize_rows(x, x_stride, rows, k, parts, quantized.data());
  const int64_t groups = (n + kGroupRows - 1) / kGroupRows;
  const int64_t rows_per_pass = kMaxGroupRows / parts;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* group = packed + g * blocks * kGroupBlockBytes<kType>;
    const int64_t outputs = std::min(kGroupRows, n - g * kGroupRows);
    float sums[kMaxGroupRows][kGroupRows];
    for (int64_t first = 0; first < rows; first += rows_per_pass) {
      const int64_t count = std::min<int64_t>(rows_per_pass, rows - first);
      kGroupDots<kType>[count * parts](group, quantized.data() + first * parts * blocks, blocks,
                                       sums);
      for (int64_t m = 0; m < count; ++m)
        for (int64_t r = 0; r < outputs; ++r) {
          const int64_t out = g * kGroupRows + r;
          float sum = bias ? to_float(bias[out]) : 0.f;
          for (int64_t part = 0; part < parts; ++part) sum += sums[m * parts + part][r];
          store(sum, y + (first + m) * n + out);
        }
    }
  }
}

// Rows ``rows[i]`` (or i, without ``rows``) of a packed weight into out[i].
template <int32_t kType, typename T>
void packed_dequantize(const uint8_t* packed, int64_t k, const int64_t* rows, int64_t count,
                       T* out) {
  const int64_t blocks = k / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = rows ? rows[i] : i;
    const int64_t g = row / kGroupRows, r = row % kGroupRows;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = packed + (g * blocks + b) * kGroupBlockBytes<kType>;
      const float d = half_to_float(block + 2 * r);
      const float low = kType == kQ4_1 ? half_to_float(block + 16 + 2 * r) : 0.f;
      const int32_t zero = kType == kQ4_0 ? 8 : 0;
      T* values = out + i * k + b * kBlock;
      for (int64_t c = 0; c < kChunks<kType>; ++c)
        for (int64_t j = 0; j < 4; ++j) {
          const uint8_t byte = block[kScaleBytes<kType> + c * 32 + r * 4 + j];
          if constexpr (kType == kQ8_0) {
            store(d * float(int8_t(byte)), values + 4 * c + j);
          } else {
            store(d * float((byte & 0x0f) - zero) + low, values + 4 * c + j);
            store(d * float((byte >> 4) - zero) + low, values + 16 + 4 * c + j);
          }
        }
    }
  }
}

template <typename T>
void linear_any(int32_t type, const T* x, int64_t x_stride, int64_t rows, const uint8_t* weight,
                const T* bias, int64_t n, int64_t k, T* y) {
  if (type == kQ4_0) linear<kQ4_0>(x, x_stride, rows, weight, bias, n, k, y);
  if (type == kQ4_1) linear<kQ4_1>(x, x_stride, rows, weight, bias, n, k, y);
  if (type == kQ8_0) linear<kQ8_0>(x, x_stride, rows, weight, bias, n, k, y);
}

template <typename T>
void dequantize_any(int32_t type, const uint8_t* weight, int64_t n, int64_t k, T* out) {
  if (type == kQ4_0) dequantize<kQ4_0>(weight, n, k, out);
  if (type == kQ4_1) dequantize<kQ4_1>(weight, n, k, out);
  if (type == kQ8_0) dequantize<kQ8_0>(weight, n, k, out);
}

}  // namespace

// Bytes of one block of 32 weights of a GGML type; 0 for a type this library does not take.
extern "C" int64_t quantized_block_bytes(int32_t type) {
  if (type == kQ4_0) return kBlockBytes<kQ4_0>;
  if (type == kQ4_1) return kBlockBytes<kQ4_1>;
  if (type == kQ8_0) return kBlockBytes<kQ8_0>;
  return 0;
}

extern "C" void quantized_linear_float32(int32_t type, const float* x, int64_t x_stride,
                                         int64_t rows, const uint8_t* weight, const float* bias,
                                         int64_t n, int64_t k, float* y) {
  linear_any(type, x, x_stride, rows, weight, bias, n, k, y);
}

extern "C" void quantized_linear_bfloat16(int32_t type, const bf16* x, int64_t x_stride,
                                          int64_t rows, const uint8_t* weight, const bf16* bias,
                                          int64_t n, int64_t k, bf16* y) {
  linear_any(type, x, x_stride, rows, weight, bias, n, k, y);
}

extern "C" void dequantize_float32(int32_t type, const uint8_t* weight, int64_t n, int64_t k,
                                   float* out) {
  dequantize_any(type, weight, n, k, out);
}

extern "C" void dequantize_bfloat16(int32_t type, const uint8_t* weight, int64_t n, int64_t k,
                                    bf16* out) {
  dequantize_any(type, weight, n, k, out);
}

// The re-laid-out form (8-row groups) of Q4_0, Q4_1 and Q8_0 weights: its size in bytes,
// the packing, the linear layer over it and the de-quantization of some of its rows.
namespace {

template <typename Run>
void with_type(int32_t type, Run&& run) {
  if (type == kQ4_0) run(std::integral_constant<int32_t, kQ4_0>{});
  if (type == kQ4_1) run(std::integral_constant<int32_t, kQ4_1>{});
  if (type == kQ8_0) run(std::integral_constant<int32_t, kQ8_0>{});
}

}  // namespace

extern "C" int64_t packed_bytes(int32_t type, int64_t n, int64_t k) {
  const int64_t groups = (n + kGroupRows - 1) / kGroupRows, blocks = k / kBlock;
  int64_t size = 0;
  with_type(type, [&](auto t) { size = groups * blocks * kGroupBlockBytes<decltype(t)::value>; });
  return size;
}

extern "C" void pack(int32_t type, const uint8_t* weight, int64_t n, int64_t k, uint8_t* packed) {
  with_type(type, [&](auto t) { pack_groups<decltype(t)::value>(weight, n, k, packed); });
}

extern "C" void packed_linear_float32(int32_t type, const float* x, int64_t x_stride, int64_t rows,
                                      const uint8_t* packed, const float* bias, int64_t n,
                                      int64_t k, float* y) {
  with_type(type, [&](auto t) {
    packed_linear<decltype(t)::value>(x, x_stride, rows, packed, bias, n, k, y);
  });
}

extern "C" void packed_linear_bfloat16(int32_t type, const bf16* x, int64_t x_stride, int64_t rows,
                                       const uint8_t* packed, const bf16* bias, int64_t n,
                                       int64_t k, bf16* y) {
  with_type(type, [&](auto t) {
    packed_linear<decltype(t)::value>(x, x_stride, rows, packed, bias, n, k, y);
  });
}

extern "C" void packed_dequantize_float32(int32_t type, const uint8_t* packed, int64_t k,
                                          const int64_t* rows, int64_t count, float* out) {
  with_type(type, [&](auto t) { packed_dequantize<decltype(t)::value>(packed, k, rows, count, out); });
}

extern "C" void packed_dequantize_bfloat16(int32_t type, const uint8_t* packed, int64_t k,
                                           const int64_t* rows, int64_t count, bf16* out) {
  with_type(type, [&](auto t) { packed_dequantize<decltype(t)::value>(packed, k, rows, count, out); });
}
