// Paged attention for CPU hosts.
//
// Same contract as kernels/reference/attention.py, but each sequence's keys and
// values are read straight from the blocks its table names, in the cache's own
// dtype: no gathered copy, no dtype-converted copy, no padding mask. The math
// runs in fp32. Work is split into tiles of (sequence, kv head, up to
// kTileTokens query tokens) so that a decode batch and a long prefill chunk both
// keep every core busy; the threads are torch's own OpenMP pool (the library
// links the libgomp that torch has already loaded).
//
// Per tile: scores of every query against every key it sees (16 keys at a time),
// a softmax per query, then the weighted sums of the value rows, a few queries at
// a time so that their sums stay in registers (AVX-512, head size a multiple of 32).
// With a sliding window a tile reads only the keys its tokens see (those before the
// window may be in blocks already back in the pool); a logit soft-cap c turns each
// scaled score s into c * tanh(s / c) before the softmax.
//
// Value rows lie where key rows lie (a cache of their own with the keys' layout, or
// the keys' own rows: multi-head latent attention reads each key row's first
// value_size features as its value); value_size may be less than head_size.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "dtypes.h"

namespace {

using genfleet::bf16;
using genfleet::store;
using genfleet::to_float;

// Query tokens of one sequence that share a pass over its keys.
constexpr int64_t kTileTokens = 16;

struct Layout {
  int64_t num_heads, num_kv_heads, head_size, value_size, block_size, table_width;
  float scale;
  int64_t sliding_window;  // 0: every earlier key
  float logit_softcap;  // 0: none
};

struct Tile {
  int64_t seq, kv_head, first_token, end_token;  // tokens index the flattened query
};

// T: the query's and output's element type; C: the cache's (T, or an fp8 format).
template <typename T, typename C>
struct Step {
  const T* query;  // [num_tokens, num_heads, head_size], rows query_stride apart
  int64_t query_stride;
  const C* key_cache;  // [num_blocks, block_size, num_kv_heads, head_size]
  const C* value_cache;  // rows as the keys', value_size features read of each
  const int32_t* block_tables;  // [num_seqs, table_width]
  const int64_t* seq_lens;  // [num_seqs], this step's tokens included
  const int64_t* query_start_loc;  // [num_seqs + 1]
  T* out;  // [num_tokens, num_heads, value_size]
  Layout layout;
};

// Walks the keys first_key..num_keys-1 of the tile's sequence and kv head in order,
// a block at a time so that no key costs a division. visit(first_key, rows, count):
// `count` (at most kRun) consecutive keys whose rows in `cache` start at `rows`
// and lie row_stride apart.
constexpr int64_t kRun = 16;

template <typename T, typename C, typename Visit>
void for_each_run(const Step<T, C>& step, const C* cache, const Tile& tile, int64_t first_key,
                  int64_t num_keys, Visit visit) {
  const Layout& l = step.layout;
  const int64_t row_stride = l.num_kv_heads * l.head_size;
  const int32_t* table = step.block_tables + tile.seq * l.table_width;
  int64_t b = first_key / l.block_size;
  for (int64_t first = b * l.block_size; first < num_keys; first += l.block_size, ++b) {
    const C* block = cache + int64_t(table[b]) * l.block_size * row_stride + tile.kv_head * l.head_size;
    const int64_t rows = std::min(l.block_size, num_keys - first);
    for (int64_t r = std::max<int64_t>(0, first_key - first); r < rows; r += kRun)
      visit(first + r, block + r * row_stride, std::min(kRun, rows - r));
  }
}

// Asks the cache hierarchy for `count` rows (row_stride elements apart) ahead of use.
template <typename T>
void prefetch_rows(const T* rows, int64_t count, int64_t row_stride, int64_t dim) {
  const int64_t row_bytes = dim * int64_t(sizeof(T));
  for (int64_t j = 0; j < count; ++j) {
    const char* row = reinterpret_cast<const char*>(rows + j * row_stride);
    for (int64_t byte = 0; byte < row_bytes; byte += 64) __builtin_prefetch(row + byte, 0, 1);
  }
}

// The two inner loops over head_size features. kDim is the head size when it is
// known at compile time and a multiple of 32 (then AVX-512 registers hold the
// rows), 0 otherwise (plain loops the compiler vectorises as it can).
#ifdef __AVX512F__
constexpr bool kAvx512 = true;
#else
constexpr bool kAvx512 = false;
#endif

template <int64_t kDim, bool kVector = (kAvx512 && kDim > 0 && kDim % 32 == 0)>
struct RowMath;

template <int64_t kDim>
struct RowMath<kDim, false> {
  static constexpr int64_t kQueries = 4;  // queries whose weighted sums are built together
  int64_t dim, row_stride;
  std::vector<float> acc;

  RowMath(int64_t head_size, int64_t stride)
      : dim(kDim ? kDim : head_size), row_stride(stride), acc(size_t(kQueries * dim)) {}

  // out[j] = scale * q . row j, for `count` rows.
  template <typename T, typename C>
  void scores(const T* q, const C* rows, int64_t count, float scale, float* out) const {
    for (int64_t j = 0; j < count; ++j) {
      const C* row = rows + j * row_stride;
      float sum = 0.f;
      for (int64_t d = 0; d < dim; ++d) sum += to_float(q[d]) * to_float(row[d]);
      out[j] = sum * scale;
    }
  }
  void clear() { std::fill(acc.begin(), acc.end(), 0.f); }
  // acc[i] += weights[i * weight_stride + j] * row j, for queries i < n and `count` rows.
  template <typename C>
  void add(const float* weights, int64_t weight_stride, int64_t n, const C* rows, int64_t count) {
    for (int64_t j = 0; j < count; ++j)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t d = 0; d < dim; ++d)
          acc[size_t(i * dim + d)] += weights[i * weight_stride + j] * to_float(rows[j * row_stride + d]);
  }
  template <typename T>
  void store_scaled(int64_t i, float factor, T* out) const {
    for (int64_t d = 0; d < dim; ++d) store(acc[size_t(i * dim + d)] * factor, out + d);
  }
};

#ifdef __AVX512F__
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load16(const bf16* p) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

// fp8 through fp16, exactly: an e5m2 byte is the top byte of the fp16 of its value;
// an e4m3 byte's exponent and mantissa, placed in a fp16's, give its value / 2^8
// (the exponent biases differ by 8; subnormals map to subnormals). The one code
// this misreads, e4m3's NaN, is never written (writes saturate).
inline __m512 load16(const genfleet::fp8_e5m2* p) {
  const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtph_ps(_mm256_slli_epi16(bytes, 8));
}

inline __m512 load16(const genfleet::fp8_e4m3* p) {
  const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(bytes, _mm256_set1_epi16(0x80)), 8);
  const __m256i rest = _mm256_slli_epi16(_mm256_and_si256(bytes, _mm256_set1_epi16(0x7f)), 7);
  return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_or_si256(sign, rest)), _mm512_set1_ps(256.f));
}

// Lane j of the result is the sum of the lanes of p[j]: a transposing add tree,
// 45 instructions for 16 sums instead of 16 horizontal reductions.
inline __m512 sum_each(const __m512 (&p)[kRun]) {
  __m512 x[8], y[4], z[2];
  for (int i = 0; i < 8; ++i)
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(p[2 * i], p[2 * i + 1]),
                         _mm512_unpackhi_ps(p[2 * i], p[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(x[2 * i]), b = _mm512_castps_pd(x[2 * i + 1]);
    y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; ++i)
    z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xDD));
}

template <int64_t kDim>
struct RowMath<kDim, true> {
  static constexpr int kLanes = int(kDim / 16);
  static constexpr int kQueries = 16 / kLanes;  // 16 registers of sums: 4 queries at 64
  int64_t row_stride;
  __m512 acc[kQueries][kLanes];

  RowMath(int64_t, int64_t stride) : row_stride(stride) {}

  // Per-row partial sums of q . row j, 16 lanes each.
  template <typename T, typename C>
  __m512 partial(const T* q, const C* row) const {
#ifdef __AVX512BF16__
    if constexpr (std::is_same_v<T, bf16> && std::is_same_v<C, bf16>) {
      // bf16 pairs straight into the dot-product instruction: products are exact
      // in fp32 and accumulate in fp32.
      __m512 sum = _mm512_setzero_ps();
      for (int i = 0; i < kLanes / 2; ++i)
        sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_loadu_si512(q + 32 * i),
                               (__m512bh)_mm512_loadu_si512(row + 32 * i));
      return sum;
    }
#endif
    __m512 sum = _mm512_mul_ps(load16(q), load16(row));
    for (int i = 1; i < kLanes; ++i) sum = _mm512_fmadd_ps(load16(q + 16 * i), load16(row + 16 * i), sum);
    return sum;
  }

  template <typename T, typename C>
  void scores(const T* q, const C* rows, int64_t count, float scale, float* out) const {
    __m512 parts[kRun];
#pragma GCC unroll 16
    for (int j = 0; j < kRun; ++j)
      parts[j] = j < count ? partial(q, rows + j * row_stride) : _mm512_setzero_ps();
    const __m512 sums = _mm512_mul_ps(sum_each(parts), _mm512_set1_ps(scale));
    _mm512_mask_storeu_ps(out, __mmask16((1u << count) - 1u), sums);
  }
  void clear() {
    for (auto& lanes : acc)
      for (auto& lane : lanes) lane = _mm512_setzero_ps();
  }
  // Each value row is loaded once for up to kQueries queries, whose sums stay in
  // registers and form independent chains of multiply-adds.
  template <typename C>
  void add(const float* weights, int64_t weight_stride, int64_t n, const C* rows, int64_t count) {
    for (int64_t j = 0; j < count; ++j) {
      __m512 row[kLanes];
      for (int l = 0; l < kLanes; ++l) row[l] = load16(rows + j * row_stride + 16 * l);
#pragma GCC unroll 16
      for (int i = 0; i < kQueries; ++i) {
        if (i >= n) break;
        const __m512 w = _mm512_set1_ps(weights[i * weight_stride + j]);
        for (int l = 0; l < kLanes; ++l) acc[i][l] = _mm512_fmadd_ps(w, row[l], acc[i][l]);
      }
    }
  }
  template <typename T>
  void store_scaled(int64_t i, float factor, T* out) const {
    alignas(64) float lanes[kDim];
    const __m512 f = _mm512_set1_ps(factor);
    for (int l = 0; l < kLanes; ++l) _mm512_store_ps(lanes + 16 * l, _mm512_mul_ps(acc[i][l], f));
    for (int64_t d = 0; d < kDim; ++d) store(lanes[d], out + d);
  }
};
#endif

template <typename T, typename C, int64_t kDim>
void attend(const Step<T, C>& step, const Tile& tile, std::vector<float>& scratch) {
  const Layout& l = step.layout;
  const int64_t dim = l.head_size;
  const int64_t group = l.num_heads / l.num_kv_heads;
  const int64_t seq_start = step.query_start_loc[tile.seq];
  const int64_t q_len = step.query_start_loc[tile.seq + 1] - seq_start;
  // Position of the tile's first token; token t of the tile sees keys 0..first_pos + t.
  const int64_t first_pos = step.seq_lens[tile.seq] - q_len + (tile.first_token - seq_start);
  const int64_t tokens = tile.end_token - tile.first_token;
  const int64_t queries = tokens * group;  // query q = token (q / group), head (q % group)
  const int64_t num_keys = first_pos + tokens;  // seen by the tile's last token
  // The first key a token at `pos` sees; the tile's first token sees the earliest.
  const int64_t window = l.sliding_window;
  auto lowest_key = [&](int64_t pos) { return window ? std::max<int64_t>(0, pos - window + 1) : 0; };
  const int64_t base = lowest_key(first_pos);  // scores hold keys base..num_keys-1
  const int64_t width = num_keys - base;
  auto query_row = [&](int64_t q) {
    return step.query + (tile.first_token + q / group) * step.query_stride +
           (tile.kv_head * group + q % group) * dim;
  };
  auto out_row = [&](int64_t q) {
    return step.out + ((tile.first_token + q / group) * l.num_heads + tile.kv_head * group + q % group) * l.value_size;
  };

  // Scores of query q against keys base..num_keys-1, then 1 / (sum of its weights).
  scratch.resize(size_t(queries * (width + 1)));
  float* scores = scratch.data();
  float* inv_sums = scores + queries * width;
  const int64_t row_stride = l.num_kv_heads * dim;
  RowMath<kDim> math(dim, row_stride);
  RowMath<kDim> values(l.value_size, row_stride);  // kDim: only where value_size == dim

  for_each_run(step, step.key_cache, tile, base, num_keys, [&](int64_t first_key, const C* rows, int64_t count) {
    // The same rows of V are read after the softmax: asked for now, they are in cache
    // by then (20% off a decode step's attention here).
    prefetch_rows(step.value_cache + (rows - step.key_cache), count, row_stride, l.value_size);
    // The run is seen by the tile's queries from (first_key - first_pos) * group on.
    for (int64_t q = std::max<int64_t>(0, first_key - first_pos) * group; q < queries; ++q)
      math.scores(query_row(q), rows, count, l.scale, scores + q * width + (first_key - base));
  });

  // Softmax per query: scores become unnormalised weights, zero outside its window.
  const float cap = l.logit_softcap;
  for (int64_t q = 0; q < queries; ++q) {
    float* s = scores + q * width;
    const int64_t pos = first_pos + q / group;
    const int64_t lo = lowest_key(pos) - base, seen = pos + 1 - base;
    if (cap != 0.f)
      for (int64_t key = lo; key < seen; ++key) s[key] = cap * std::tanh(s[key] / cap);
    float max = s[lo];
    for (int64_t key = lo + 1; key < seen; ++key) max = std::max(max, s[key]);
    float sum = 0.f;
    for (int64_t key = lo; key < seen; ++key) {
      s[key] = std::exp(s[key] - max);
      sum += s[key];
    }
    std::fill(s, s + lo, 0.f);
    std::fill(s + seen, s + width, 0.f);
    inv_sums[q] = 1.f / sum;
  }

  // Weighted sums of the value rows, kQueries queries per walk over the keys.
  for (int64_t first = 0; first < queries; first += values.kQueries) {
    const int64_t n = std::min<int64_t>(values.kQueries, queries - first);
    const int64_t keys = first_pos + (first + n - 1) / group + 1;  // seen by the last of them
    const int64_t from = lowest_key(first_pos + first / group);  // by the first of them
    values.clear();
    for_each_run(step, step.value_cache, tile, from, keys, [&](int64_t first_key, const C* rows, int64_t count) {
      values.add(scores + first * width + (first_key - base), width, n, rows, count);
    });
    for (int64_t i = 0; i < n; ++i) values.store_scaled(i, inv_sums[first + i], out_row(first + i));
  }
}

template <typename T, typename C>
void run(const Step<T, C>& step, int64_t num_seqs) {
  std::vector<Tile> tiles;
  for (int64_t seq = 0; seq < num_seqs; ++seq) {
    const int64_t begin = step.query_start_loc[seq], end = step.query_start_loc[seq + 1];
    for (int64_t first = begin; first < end; first += kTileTokens)
      for (int64_t kv_head = 0; kv_head < step.layout.num_kv_heads; ++kv_head)
        tiles.push_back({seq, kv_head, first, std::min(first + kTileTokens, end)});
  }
  const int64_t num_tiles = int64_t(tiles.size());
  // Common head sizes get the vector path (keys and values of one size).
  const int64_t dim = step.layout.head_size;
  const bool same = step.layout.value_size == dim;
  auto attend_tile = same && dim == 64 ? attend<T, C, 64> : same && dim == 128 ? attend<T, C, 128> : attend<T, C, 0>;
#pragma omp parallel
  {
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_tiles; ++i) attend_tile(step, tiles[size_t(i)], scratch);
  }
}

}  // namespace

// paged_attention_<element type>, and paged_attention_<fp8 format>_<element type>
// for an fp8 cache.
#define GENFLEET_PAGED_ATTENTION(T, C, NAME)                                                   \
  extern "C" void NAME(                                                                         \
      const T* query, int64_t query_stride, const C* key_cache, const C* value_cache,           \
      const int32_t* block_tables, const int64_t* seq_lens, const int64_t* query_start_loc,     \
      int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,             \
      int64_t value_size, int64_t block_size, int64_t table_width, float scale,                 \
      int64_t sliding_window, float logit_softcap, T* out) {                                    \
    const Layout layout{num_heads,  num_kv_heads, head_size, value_size,    block_size,         \
                        table_width, scale,       sliding_window, logit_softcap};               \
    const Step<T, C> step{query,    query_stride,    key_cache, value_cache, block_tables,      \
                          seq_lens, query_start_loc, out,       layout};                        \
    run(step, num_seqs);                                                                        \
  }

GENFLEET_PAGED_ATTENTION(float, float, paged_attention_float32)
GENFLEET_PAGED_ATTENTION(bf16, bf16, paged_attention_bfloat16)
GENFLEET_PAGED_ATTENTION(float, genfleet::fp8_e4m3, paged_attention_e4m3_float32)
GENFLEET_PAGED_ATTENTION(bf16, genfleet::fp8_e4m3, paged_attention_e4m3_bfloat16)
GENFLEET_PAGED_ATTENTION(float, genfleet::fp8_e5m2, paged_attention_e5m2_float32)
GENFLEET_PAGED_ATTENTION(bf16, genfleet::fp8_e5m2, paged_attention_e5m2_bfloat16)
