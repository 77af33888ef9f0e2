// The small per-layer ops for CPU hosts, one pass over memory each.
//
// In torch each of these is several element-wise calls (casts, reductions,
// slices, in-place copies); at decode batch sizes their fixed cost per call,
// not their arithmetic, is what a step pays. Contracts are those of the torch
// references in kernels/reference/. Rows are given with their stride so that
// views into the fused qkv projection need no copy.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dtypes.h"

namespace {

using genfleet::bf16;
using genfleet::store;
using genfleet::to_float;

// Below this many elements a second thread costs more than it saves.
constexpr int64_t kParallelElements = 1 << 16;

// out = weight * (x / rms(x)) per row, where x = x + residual first when a
// residual is given (that sum, rounded to T, is also written to residual_out).
template <typename T>
void rms_norm(const T* x, int64_t x_stride, const T* residual, int64_t residual_stride,
              const T* weight, int64_t rows, int64_t width, float eps, T* out, T* residual_out) {
#pragma omp parallel for if (rows * width >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * x_stride;
    T* outr = out + r * width;
    T* sum_row = residual ? residual_out + r * width : nullptr;
    float square_sum = 0.f;
    for (int64_t c = 0; c < width; ++c) {
      float v = to_float(xr[c]);
      if (sum_row) {
        store(v + to_float(residual[r * residual_stride + c]), sum_row + c);
        v = to_float(sum_row[c]);  // the reference normalises the rounded sum
      }
      square_sum += v * v;
    }
    const float inv_rms = 1.f / std::sqrt(square_sum / float(width) + eps);
    const T* src = sum_row ? sum_row : xr;
    for (int64_t c = 0; c < width; ++c) {
      T normed;
      store(to_float(src[c]) * inv_rms, &normed);  // cast back before the weight, as Llama does
      store(to_float(weight[c]) * to_float(normed), outr + c);
    }
  }
}

// Rotates the first rotary_dim features of each head of q and k in place by the
// token's position: the two halves of the rotated part (neox) or even/odd pairs.
template <typename T>
void rotate_heads(T* rows, int64_t stride, int64_t heads, const int64_t* positions,
                  int64_t num_tokens, const float* cos_sin_cache, int64_t rotary_dim,
                  int64_t head_size, bool is_neox) {
  const int64_t half = rotary_dim / 2;
#pragma omp parallel for if (num_tokens * heads * rotary_dim >= kParallelElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* cos = cos_sin_cache + positions[t] * rotary_dim;
    const float* sin = cos + half;
    for (int64_t h = 0; h < heads; ++h) {
      T* head = rows + t * stride + h * head_size;
      for (int64_t i = 0; i < half; ++i) {
        T* a = is_neox ? head + i : head + 2 * i;
        T* b = is_neox ? head + half + i : head + 2 * i + 1;
        const float x1 = to_float(*a), x2 = to_float(*b);
        store(x1 * cos[i] - x2 * sin[i], a);
        store(x2 * cos[i] + x1 * sin[i], b);
      }
    }
  }
}

// out[t] = act(x[t, :d]) * x[t, d:], act SiLU or Gemma's GeLU (tanh approximation)
template <typename T, typename Act>
void gated(const T* x, int64_t rows, int64_t d, T* out, Act act) {
#pragma omp parallel for if (rows * d >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = x + r * 2 * d;
    const T* up = gate + d;
    for (int64_t c = 0; c < d; ++c) store(act(to_float(gate[c])) * to_float(up[c]), out + r * d + c);
  }
}

// Function objects, not function pointers: the loop above inlines them.
struct Silu {
  float operator()(float g) const { return g / (1.f + std::exp(-g)); }
};

struct GeluTanh {
  float operator()(float g) const {
    constexpr float kAlpha = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * g * (1.f + std::tanh(kAlpha * (g + 0.044715f * g * g * g)));
  }
};

// Copies each token's K and V row (kv_heads * head_size contiguous elements) to
// its cache slot, rounded to the cache's element type C when it is an fp8 one; a
// slot of -1 is padding and is skipped.
template <typename T, typename C>
void copy_row(const T* from, int64_t row, C* to) {
  if constexpr (std::is_same_v<T, C>) {
    std::memcpy(to, from, size_t(row) * sizeof(T));
  } else {
    for (int64_t i = 0; i < row; ++i) store(to_float(from[i]), to + i);
  }
}

template <typename T, typename C>
void write_kv_cache(const T* key, int64_t key_stride, const T* value, int64_t value_stride,
                    C* key_cache, C* value_cache, const int64_t* slot_mapping, int64_t num_tokens,
                    int64_t row) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    copy_row(key + t * key_stride, row, key_cache + slot * row);
    copy_row(value + t * value_stride, row, value_cache + slot * row);
  }
}

}  // namespace

#define GENFLEET_LAYER_OPS(T, SUFFIX)                                                           \
  extern "C" void rms_norm_##SUFFIX(const T* x, int64_t x_stride, const T* residual,           \
                                    int64_t residual_stride, const T* weight, int64_t rows,    \
                                    int64_t width, float eps, T* out, T* residual_out) {       \
    rms_norm(x, x_stride, residual, residual_stride, weight, rows, width, eps, out,             \
             residual_out);                                                                    \
  }                                                                                            \
  extern "C" void rotary_embedding_##SUFFIX(                                                   \
      const int64_t* positions, int64_t num_tokens, T* query, int64_t query_stride,            \
      int64_t num_heads, T* key, int64_t key_stride, int64_t num_kv_heads,                     \
      const float* cos_sin_cache, int64_t rotary_dim, int64_t head_size, int32_t is_neox) {    \
    rotate_heads(query, query_stride, num_heads, positions, num_tokens, cos_sin_cache,         \
                 rotary_dim, head_size, is_neox != 0);                                         \
    rotate_heads(key, key_stride, num_kv_heads, positions, num_tokens, cos_sin_cache,          \
                 rotary_dim, head_size, is_neox != 0);                                         \
  }                                                                                            \
  extern "C" void silu_and_mul_##SUFFIX(const T* x, int64_t rows, int64_t d, T* out) {         \
    gated(x, rows, d, out, Silu{});                                                            \
  }                                                                                            \
  extern "C" void gelu_tanh_and_mul_##SUFFIX(const T* x, int64_t rows, int64_t d, T* out) {    \
    gated(x, rows, d, out, GeluTanh{});                                                        \
  }                                                                                            \
  extern "C" void write_kv_cache_##SUFFIX(const T* key, int64_t key_stride, const T* value,    \
                                          int64_t value_stride, T* key_cache, T* value_cache,  \
                                          const int64_t* slot_mapping, int64_t num_tokens,     \
                                          int64_t row) {                                       \
    write_kv_cache(key, key_stride, value, value_stride, key_cache, value_cache, slot_mapping,  \
                   num_tokens, row);                                                           \
  }

GENFLEET_LAYER_OPS(float, float32)
GENFLEET_LAYER_OPS(bf16, bfloat16)

// Into an fp8 cache: write_kv_cache_<format>_<element type of K and V>.
#define GENFLEET_WRITE_FP8(T, SUFFIX, C, FORMAT)                                                \
  extern "C" void write_kv_cache_##FORMAT##_##SUFFIX(                                            \
      const T* key, int64_t key_stride, const T* value, int64_t value_stride, C* key_cache,      \
      C* value_cache, const int64_t* slot_mapping, int64_t num_tokens, int64_t row) {            \
    write_kv_cache(key, key_stride, value, value_stride, key_cache, value_cache, slot_mapping,  \
                   num_tokens, row);                                                            \
  }

GENFLEET_WRITE_FP8(float, float32, genfleet::fp8_e4m3, e4m3)
GENFLEET_WRITE_FP8(bf16, bfloat16, genfleet::fp8_e4m3, e4m3)
GENFLEET_WRITE_FP8(float, float32, genfleet::fp8_e5m2, e5m2)
GENFLEET_WRITE_FP8(bf16, bfloat16, genfleet::fp8_e5m2, e5m2)
