// bfloat16 linear layer (y = x W^T + b) for the small batches of decoding.
//
// At a few rows per step a linear layer is a stream over its weight, so what
// matters is reading the weight at memory speed. The weight is packed once so
// that the stream is sequential and needs no horizontal sums: for every group
// of 32 outputs, for every pair of input features (k, k+1), the 32 outputs'
// two weights lie side by side (64 bf16, two 512-bit loads). One AVX512-BF16
// dot-product instruction then adds x[m,k]*W[n,k] + x[m,k+1]*W[n,k+1] for 16
// outputs at once, accumulating in fp32. Rows of x are taken in tiles whose
// accumulators stay in registers; output groups are split across threads.
// CPUs without AVX512-BF16 get only linear_available() == 0.
#include <cstdint>

#ifdef __AVX512BF16__
#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace {

constexpr int64_t kGroup = 32;  // outputs per packed group: two 16-lane registers
constexpr int64_t kMaxTile = 12;  // rows per tile: 2 * 12 accumulators fit the 32 registers

using bf16 = uint16_t;

// Packs W [n, k] (k even) into [ceil(n / 32)][k / 2][32][2]; missing outputs are zero.
void pack(const bf16* weight, int64_t n, int64_t k, bf16* packed) {
  const int64_t pairs = k / 2;
  for (int64_t group = 0; group * kGroup < n; ++group)
    for (int64_t p = 0; p < pairs; ++p)
      for (int64_t j = 0; j < kGroup; ++j) {
        const int64_t row = group * kGroup + j;
        bf16* dst = packed + ((group * pairs + p) * kGroup + j) * 2;
        dst[0] = row < n ? weight[row * k + 2 * p] : 0;
        dst[1] = row < n ? weight[row * k + 2 * p + 1] : 0;
      }
}

inline __m512 bias_lanes(const bf16* bias, int64_t first, int64_t n) {
  if (!bias) return _mm512_setzero_ps();
  alignas(64) float lanes[16];
  for (int64_t j = 0; j < 16; ++j) {
    uint32_t bits = first + j < n ? uint32_t(bias[first + j]) << 16 : 0;
    std::memcpy(&lanes[j], &bits, sizeof bits);
  }
  return _mm512_load_ps(lanes);
}

inline void store_lanes(__m512 values, bf16* out, int64_t count) {
  const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(values);  // round to nearest even
  if (count >= 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), rounded);
    return;
  }
  alignas(32) bf16 lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), rounded);
  std::memcpy(out, lanes, size_t(count) * sizeof(bf16));
}

// One group of 32 outputs for rows [0, kTile) of x.
template <int kTile>
void group_tile(const bf16* x, int64_t x_stride, const bf16* packed_group, const bf16* bias,
                int64_t first_output, int64_t n, int64_t pairs, bf16* y, int64_t y_stride) {
  __m512 acc[kTile][2];
  const __m512 bias_low = bias_lanes(bias, first_output, n);
  const __m512 bias_high = bias_lanes(bias, first_output + 16, n);
  for (int m = 0; m < kTile; ++m) {
    acc[m][0] = bias_low;
    acc[m][1] = bias_high;
  }
  for (int64_t p = 0; p < pairs; ++p) {
    const bf16* w = packed_group + p * kGroup * 2;
    const __m512bh w_low = (__m512bh)_mm512_loadu_si512(w);
    const __m512bh w_high = (__m512bh)_mm512_loadu_si512(w + 32);
    for (int m = 0; m < kTile; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * x_stride + 2 * p, sizeof pair);
      const __m512bh xs = (__m512bh)_mm512_set1_epi32(pair);
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], xs, w_low);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], xs, w_high);
    }
  }
  const int64_t outputs = std::min(kGroup, n - first_output);
  for (int m = 0; m < kTile; ++m) {
    bf16* out = y + m * y_stride + first_output;
    store_lanes(acc[m][0], out, outputs);
    if (outputs > 16) store_lanes(acc[m][1], out + 16, outputs - 16);
  }
}

template <int kTile>
void rows_tile(const bf16* x, int64_t x_stride, const bf16* packed, const bf16* bias, int64_t n,
               int64_t pairs, bf16* y, int64_t y_stride, int64_t group) {
  group_tile<kTile>(x, x_stride, packed + group * pairs * kGroup * 2, bias, group * kGroup, n,
                    pairs, y, y_stride);
}

using RowsTile = void (*)(const bf16*, int64_t, const bf16*, const bf16*, int64_t, int64_t, bf16*,
                          int64_t, int64_t);

constexpr RowsTile kTiles[kMaxTile + 1] = {
    nullptr,          rows_tile<1>, rows_tile<2>, rows_tile<3>,  rows_tile<4>,
    rows_tile<5>,     rows_tile<6>, rows_tile<7>, rows_tile<8>,  rows_tile<9>,
    rows_tile<10>,    rows_tile<11>, rows_tile<12>};

void linear(const bf16* x, int64_t x_stride, int64_t rows, const bf16* packed, const bf16* bias,
            int64_t n, int64_t k, bf16* y) {
  const int64_t pairs = k / 2;
  const int64_t groups = (n + kGroup - 1) / kGroup;
  // Each thread streams its own run of weight groups once per row tile; a group's
  // weights are small enough to stay in that core's cache for the next tile.
#pragma omp parallel for schedule(static)
  for (int64_t group = 0; group < groups; ++group)
    for (int64_t first = 0; first < rows; first += kMaxTile) {
      const int64_t tile = std::min(kMaxTile, rows - first);
      kTiles[tile](x + first * x_stride, x_stride, packed, bias, n, pairs, y + first * n, n, group);
    }
}

}  // namespace

extern "C" int32_t linear_available() { return 1; }

extern "C" int64_t linear_packed_size_bfloat16(int64_t n, int64_t k) {
  return (n + kGroup - 1) / kGroup * kGroup * k;
}

extern "C" void linear_pack_bfloat16(const bf16* weight, int64_t n, int64_t k, bf16* packed) {
  pack(weight, n, k, packed);
}

extern "C" void linear_bfloat16(const bf16* x, int64_t x_stride, int64_t rows, const bf16* packed,
                                const bf16* bias, int64_t n, int64_t k, bf16* y) {
  linear(x, x_stride, rows, packed, bias, n, k, y);
}

#else

extern "C" int32_t linear_available() { return 0; }

#endif
