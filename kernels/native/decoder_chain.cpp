// A whole pre-norm decoder (every layer, then the final norm) in one call, for the
// small steps of decoding on CPU hosts.
//
// At batch 1 a step is about ten ops per layer, and from Python each op costs 10 to
// 30 microseconds of dispatch, argument checks and tensor allocation: for a 30-layer
// model that was more time than reading the weights. Here the same ops run in the
// same order over buffers allocated once per call, calling the library's own entry
// points (the ones Python calls, so the numbers are the same to the bit):
//   residual = hidden (layer 0), normed = norm(hidden [+ residual])
//   qkv = qkv_proj(normed); q and k normed per head (Qwen3), rotated; k, v into the cache
//   attended = paged attention; hidden = o_proj(attended)
//   normed, residual = norm(hidden + residual)
//   hidden = down_proj(silu(gate) * up), gate and up from gate_up_proj(normed)
// and at the end out = norm(hidden + residual). Projections are packed GGUF blocks
// (``pack`` in quantized_linear.cpp); the plan is laid out by kernels/native/chain.py.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "dtypes.h"

using genfleet::bf16;

extern "C" {
// Entry points of the other sources of this library.
void rms_norm_float32(const float*, int64_t, const float*, int64_t, const float*, int64_t,
                      int64_t, float, float*, float*);
void rms_norm_bfloat16(const bf16*, int64_t, const bf16*, int64_t, const bf16*, int64_t, int64_t,
                       float, bf16*, bf16*);
void rotary_embedding_float32(const int64_t*, int64_t, float*, int64_t, int64_t, float*, int64_t,
                              int64_t, const float*, int64_t, int64_t, int32_t);
void rotary_embedding_bfloat16(const int64_t*, int64_t, bf16*, int64_t, int64_t, bf16*, int64_t,
                               int64_t, const float*, int64_t, int64_t, int32_t);
void silu_and_mul_float32(const float*, int64_t, int64_t, float*);
void silu_and_mul_bfloat16(const bf16*, int64_t, int64_t, bf16*);
void write_kv_cache_float32(const float*, int64_t, const float*, int64_t, float*, float*,
                            const int64_t*, int64_t, int64_t);
void write_kv_cache_bfloat16(const bf16*, int64_t, const bf16*, int64_t, bf16*, bf16*,
                             const int64_t*, int64_t, int64_t);
void paged_attention_float32(const float*, int64_t, const float*, const float*, const int32_t*,
                             const int64_t*, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int64_t, float, int64_t, float, float*);
void paged_attention_bfloat16(const bf16*, int64_t, const bf16*, const bf16*, const int32_t*,
                              const int64_t*, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                              int64_t, int64_t, int64_t, float, int64_t, float, bf16*);
void packed_linear_float32(int32_t, const float*, int64_t, int64_t, const uint8_t*, const float*,
                           int64_t, int64_t, float*);
void packed_linear_bfloat16(int32_t, const bf16*, int64_t, int64_t, const uint8_t*, const bf16*,
                            int64_t, int64_t, bf16*);
}

namespace {

// The plan, as kernels/native/chain.py lays it out (ctypes structures of the same fields).
struct ChainLinear {
  int64_t type;  // GGML type id of the packed blocks
  const uint8_t* packed;
  const void* bias;  // nullptr: none
  int64_t out_features;
  int64_t in_features;
};

struct ChainLayer {
  const void* input_norm;
  const void* post_attention_norm;
  const void* q_norm;  // per head, before rotary (Qwen3); nullptr: none
  const void* k_norm;
  ChainLinear qkv, o, gate_up, down;
  void* key_cache;  // [blocks, block_size, kv heads, head size]
  void* value_cache;
  const float* cos_sin;  // [positions, rotary_dim] or nullptr: no rotary in this layer
  int64_t rotary_dim;
  int64_t sliding_window;
};

struct ChainModel {
  int64_t num_layers, hidden, num_heads, num_kv_heads, head_size, block_size;
  int64_t is_neox;
  float eps, scale, logit_softcap;
  const ChainLayer* layers;
  const void* final_norm;
};

// The step, as the runner's buffers hold it.
struct ChainStep {
  const int64_t* positions;
  const int64_t* slot_mapping;
  const int32_t* block_tables;
  const int64_t* seq_lens;
  const int64_t* query_start_loc;
  int64_t num_seqs;
  int64_t table_width;
  double* seconds;  // nullptr, or where each Part's time is added (a profile of the step)
};

enum Part { kNorms, kProjections, kAttention, kActivation };

// Runs ``op``, adding its time to ``part`` where the step asks for a profile.
template <typename Op>
void timed(const ChainStep& step, Part part, Op&& op) {
  if (!step.seconds) return op();
  const auto began = std::chrono::steady_clock::now();
  op();
  step.seconds[part] += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
}

// Each op's entry point for the element type.
template <typename T>
struct Ops;

#define GENFLEET_CHAIN_OPS(T, SUFFIX)                                                           \
  template <>                                                                                   \
  struct Ops<T> {                                                                               \
    static constexpr auto norm = rms_norm_##SUFFIX;                                             \
    static constexpr auto rotary = rotary_embedding_##SUFFIX;                                   \
    static constexpr auto silu = silu_and_mul_##SUFFIX;                                         \
    static constexpr auto write = write_kv_cache_##SUFFIX;                                      \
    static constexpr auto attention = paged_attention_##SUFFIX;                                 \
    static constexpr auto linear = packed_linear_##SUFFIX;                                      \
  };

GENFLEET_CHAIN_OPS(float, float32)
GENFLEET_CHAIN_OPS(bf16, bfloat16)

template <typename T>
void project(const ChainStep& step, const ChainLinear& layer, const T* x, int64_t rows, T* y) {
  timed(step, kProjections, [&] {
    Ops<T>::linear(int32_t(layer.type), x, layer.in_features, rows, layer.packed,
                   static_cast<const T*>(layer.bias), layer.out_features, layer.in_features, y);
  });
}

// normed = norm(x + residual) and residual = x + residual; x alone without a residual.
template <typename T>
void norm(const ChainModel& model, const ChainStep& step, const void* weight, const T* x,
          T* residual, int64_t rows, T* normed) {
  timed(step, kNorms, [&] {
    Ops<T>::norm(x, model.hidden, residual, residual ? model.hidden : 0,
                 static_cast<const T*>(weight), rows, model.hidden, model.eps, normed, residual);
  });
}

// q/k norms and rotary on q and k (in place, in the qkv rows), k and v into the
// cache, attention.
template <typename T>
void attend(const ChainModel& model, const ChainLayer& layer, const ChainStep& step, int64_t rows,
            T* qkv, T* attended) {
  const int64_t q_size = model.num_heads * model.head_size;
  const int64_t kv_size = model.num_kv_heads * model.head_size;
  const int64_t width = q_size + 2 * kv_size;
  T* q = qkv;
  T* k = qkv + q_size;
  T* v = k + kv_size;
  T* key_cache = static_cast<T*>(layer.key_cache);
  T* value_cache = static_cast<T*>(layer.value_cache);
  timed(step, kAttention, [&] {
    if (layer.q_norm)  // in place, a token's heads as rows of head_size
      for (int64_t t = 0; t < rows; ++t) {
        Ops<T>::norm(q + t * width, model.head_size, nullptr, 0,
                     static_cast<const T*>(layer.q_norm), model.num_heads, model.head_size,
                     model.eps, q + t * width, nullptr);
        Ops<T>::norm(k + t * width, model.head_size, nullptr, 0,
                     static_cast<const T*>(layer.k_norm), model.num_kv_heads, model.head_size,
                     model.eps, k + t * width, nullptr);
      }
    if (layer.cos_sin)
      Ops<T>::rotary(step.positions, rows, q, width, model.num_heads, k, width,
                     model.num_kv_heads, layer.cos_sin, layer.rotary_dim, model.head_size,
                     int32_t(model.is_neox));
    Ops<T>::write(k, width, v, width, key_cache, value_cache, step.slot_mapping, rows, kv_size);
    Ops<T>::attention(q, width, key_cache, value_cache, step.block_tables, step.seq_lens,
                      step.query_start_loc, step.num_seqs, model.num_heads, model.num_kv_heads,
                      model.head_size, model.head_size, model.block_size, step.table_width,
                      model.scale, layer.sliding_window, model.logit_softcap, attended);
  });
}

template <typename T>
void run_chain(const ChainModel& model, const ChainStep& step, T* hidden, int64_t rows, T* out) {
  const int64_t q_size = model.num_heads * model.head_size;
  std::vector<T> residual(size_t(rows * model.hidden)), normed(residual.size());
  std::vector<T> qkv, attended(size_t(rows * q_size)), gate_up, gated;
  for (int64_t i = 0; i < model.num_layers; ++i) {
    const ChainLayer& layer = model.layers[i];
    if (i == 0)  // the stream is the embedding alone
      std::copy(hidden, hidden + residual.size(), residual.data());
    norm(model, step, layer.input_norm, hidden, i == 0 ? nullptr : residual.data(), rows,
         normed.data());
    qkv.resize(size_t(rows * layer.qkv.out_features));
    project(step, layer.qkv, normed.data(), rows, qkv.data());
    attend(model, layer, step, rows, qkv.data(), attended.data());
    project(step, layer.o, attended.data(), rows, hidden);
    norm(model, step, layer.post_attention_norm, hidden, residual.data(), rows, normed.data());
    const int64_t intermediate = layer.gate_up.out_features / 2;
    gate_up.resize(size_t(rows * 2 * intermediate));
    gated.resize(size_t(rows * intermediate));
    project(step, layer.gate_up, normed.data(), rows, gate_up.data());
    timed(step, kActivation,
          [&] { Ops<T>::silu(gate_up.data(), rows, intermediate, gated.data()); });
    project(step, layer.down, gated.data(), rows, hidden);
  }
  norm(model, step, model.final_norm, hidden, residual.data(), rows, out);
}

}  // namespace

// ``hidden`` [rows, hidden] holds the embedded tokens and is overwritten; the final
// norm's output goes to ``out`` [rows, hidden].
#define GENFLEET_DECODER_CHAIN(T, SUFFIX)                                                      \
  extern "C" void decoder_chain_##SUFFIX(const ChainModel* model, const ChainStep* step,      \
                                         T* hidden, int64_t rows, T* out) {                    \
    run_chain(*model, *step, hidden, rows, out);                                               \
  }

GENFLEET_DECODER_CHAIN(float, float32)
GENFLEET_DECODER_CHAIN(bf16, bfloat16)
