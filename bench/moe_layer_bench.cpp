// One routed-expert MoE layer through the fused CPU operator (moe/fused_moe.h), at real shapes:
//  - DeepSeek-V2-Lite: hidden 2048, expert ff 1408, 64 experts, top-6; Q4_K gate/up, Q5_0 down
//    (what llama-quantize's Q4_K_M makes of 1408-wide rows);
//  - Qwen3-30B-A3B: hidden 2048, expert ff 768, 128 experts, top-8; Q4_K gate/up/down.
// Decode (1 token): GBps = bytes of the selected experts' weights read per second (1e9-based;
// bytes_per_second is the same in GiB/s), of_dram = that as a fraction of DRAM read bandwidth
// measured in rounds alternating with the layer's (bench/dram_probe.h). Prefill (512 tokens,
// random routing): items_per_second = 2 x multiply-adds per second, of_peak = that as a fraction
// of the compute peak (int8; bf16 for BF16 / FP8 weights, fp32 without a BF16 dot) measured in
// rounds alternating with the layer's (peak_Gops; the label names the peak's kernel).
// The layer's weights (~200-400 MB) are far larger than this VM's L3, and each iteration routes to
// other experts, so decode reads from DRAM as in a real model. On a CPU with a large L3 (a 300 MiB
// one would hold a whole INT4 layer) the layer is held in as many copies as make 3x the L3 in use,
// cycled call by call as a model's layers are (layer_copies; TANDEM_BENCH_LAYER_COPIES=N sets
// it; BM_MoeLayerShared keeps one). They sit in one buffer of transparent huge
// pages, as a model file copied at load does (core/mapped_file.h, LoadMode::kCopy);
// TANDEM_BENCH_HUGE=0 puts them in plain 4 KiB pages (a model mapped with --mmap).
// BM_MoeLayerPacked: the V2-Lite shape with the experts repacked as `--cpu-experts int4|int8|bf16`
// does (group 128; bf16 = BF16 tiles) and as block-scaled FP8 (128 x 128 scales, a native FP8
// checkpoint's experts); prefill compares with the int8 peak (INT8/INT4) or the bf16 peak (BF16,
// FP8).
// BM_MoeLayerShared: the V2-Lite decode layer with its shared experts, as the model runs it.
// BM_MoeLayerRepack: the GGUF layers with their Q4_K experts in x16 tiles (`--cpu-experts
// repack`), vs_native against the stored rows in the same minute.
// Run: build/bench/bench_moe_layer_bench [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench/dram_probe.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "formats/quant.h"
#include "moe/cpu_experts.h"
#include "moe/fused_moe.h"
#include "model/weights.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/packed.h"
#include "ops/cpu/ref_ops.h"
#include "ops/cpu/q0_x4.h"
#include "ops/cpu/q4k_x16.h"

namespace tandem {
namespace {

struct Shape {
  int64_t hidden, ff, n_experts, k;
  DType gate_up, down;
};

struct Layer {
  AlignedBuffer bytes;  // every expert's matrices, one after the other (all copies)
  ExpertWeights w;
  uint64_t expert_bytes = 0;
  // Copies of the layer, cycled call by call (layer_copies): a packed layer's are its CpuExperts
  // layers, a GGUF layer's its w_copies (w_copies[0] is w).
  int64_t copies = 1;
  std::vector<ExpertWeights> w_copies;
};

// Copies of a layer of `bytes` that make 3x the L3 in use (at least one; TANDEM_BENCH_LAYER_COPIES
// overrides), no more than a quarter of the available memory holds.
int64_t layer_copies(uint64_t bytes) {
  if (const char* env = std::getenv("TANDEM_BENCH_LAYER_COPIES")) {
    return std::max<int64_t>(1, std::atoll(env));
  }
  return std::max<int64_t>(1, static_cast<int64_t>(dram_sized_bytes(bytes) / bytes));
}

// The weights' memory: huge pages unless TANDEM_BENCH_HUGE=0.
AlignedBuffer weight_buffer(size_t bytes) {
  const char* env = std::getenv("TANDEM_BENCH_HUGE");
  AllocOptions opt;
  opt.huge_pages = env == nullptr || std::atoi(env) != 0;
  opt.prefault = true;
  return AlignedBuffer(bytes, opt);
}

// A [rows, cols] matrix of N(0, 0.02) values quantized to dt, row by row.
std::vector<uint8_t> random_quantized(DType dt, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> f(static_cast<size_t>(rows * cols));
  for (float& v : f) v = nd(rng);
  const int64_t rb = static_cast<int64_t>(dtype_bytes(dt, cols));
  std::vector<uint8_t> q(static_cast<size_t>(rb * rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(dt, f.data() + r * cols, q.data() + r * rb, cols);
  return q;
}

// Four distinct random experts, their bytes replicated into every expert's own memory.
Layer make_layer(const Shape& s) {
  std::mt19937 rng(5);
  auto quantize = [&](DType dt, int64_t rows, int64_t cols) {
    return random_quantized(dt, rows, cols, rng);
  };
  std::vector<std::vector<uint8_t>> proto;
  for (int i = 0; i < 4; ++i) {
    proto.push_back(quantize(s.gate_up, s.ff, s.hidden));
    proto.push_back(quantize(s.gate_up, s.ff, s.hidden));
    proto.push_back(quantize(s.down, s.hidden, s.ff));
  }
  Layer l;
  l.expert_bytes = proto[0].size() + proto[1].size() + proto[2].size();
  l.copies = layer_copies(l.expert_bytes * static_cast<uint64_t>(s.n_experts));
  l.bytes = weight_buffer(static_cast<size_t>(l.expert_bytes * s.n_experts * l.copies));
  l.w_copies.resize(static_cast<size_t>(l.copies));
  uint8_t* at = l.bytes.as<uint8_t>();
  for (int64_t c = 0; c < l.copies; ++c) {
    ExpertWeights& w = l.w_copies[static_cast<size_t>(c)];
    for (int64_t e = 0; e < s.n_experts; ++e) {
      for (int m = 0; m < 3; ++m) {
        const std::vector<uint8_t>& src = proto[static_cast<size_t>((e % 4) * 3 + m)];
        std::copy(src.begin(), src.end(), at);
        const bool down = m == 2;
        const Tensor t = Tensor::dense(
            down ? s.down : s.gate_up, {down ? s.hidden : s.ff, down ? s.ff : s.hidden}, at);
        (m == 0 ? w.gate : m == 1 ? w.up : w.down).push_back(t);
        at += src.size();
      }
    }
  }
  l.w = l.w_copies[0];
  return l;
}

ThreadPool& pool() {
  return bench_pool();
}

// Packed experts: 4 distinct random experts packed (or FP8-quantized), their bytes copied into
// every expert's own memory; the stored weights are F32 headers over the prototypes (shapes only).
struct PackedLayer {
  std::vector<std::vector<float>> proto;       // F32 gate, up, down of 4 experts
  std::vector<std::vector<float>> fp8_scales;  // block scales of the 12 FP8 prototypes
  std::vector<ops::Weight> fp8_weights;
  Layer layer;
  CpuExperts ce;
};

PackedLayer* make_packed_layer(const Shape& s, kern::WFormat f) {
  auto* pl = new PackedLayer;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (int i = 0; i < 12; ++i) {
    pl->proto.emplace_back(static_cast<size_t>(s.hidden * s.ff));
    for (float& v : pl->proto.back()) v = nd(rng);
  }
  const bool fp8 = f == kern::WFormat::kFP8Block;
  auto matrix_bytes = [&](int m) {
    const int64_t rows = m == 2 ? s.hidden : s.ff, cols = m == 2 ? s.ff : s.hidden;
    return fp8 ? static_cast<uint64_t>(rows * cols) : kern::packed_bytes(f, rows, cols, 128);
  };
  for (int m = 0; m < 3; ++m) pl->layer.expert_bytes += matrix_bytes(m);
  const int64_t copies =
      layer_copies(pl->layer.expert_bytes * static_cast<uint64_t>(s.n_experts));
  pl->layer.copies = copies;
  pl->layer.bytes =
      weight_buffer(static_cast<size_t>(pl->layer.expert_bytes * s.n_experts * copies));
  pl->ce.gate.resize(static_cast<size_t>(copies));
  pl->ce.up.resize(static_cast<size_t>(copies));
  pl->ce.down.resize(static_cast<size_t>(copies));
  pl->fp8_scales.resize(12);
  pl->fp8_weights.reserve(static_cast<size_t>(3 * s.n_experts * copies));
  uint8_t* at = pl->layer.bytes.as<uint8_t>();
  uint8_t* first[12] = {};  // each prototype's bytes in experts 0-3, copied to the rest
  for (int64_t ex = 0; ex < s.n_experts * copies; ++ex) {
    const int64_t e = ex % s.n_experts, c = ex / s.n_experts;
    for (int m = 0; m < 3; ++m) {
      const bool down = m == 2;
      const int64_t rows = down ? s.hidden : s.ff, cols = down ? s.ff : s.hidden;
      const size_t i = static_cast<size_t>((e % 4) * 3 + m);
      std::vector<float>& src = pl->proto[i];
      const Tensor t = Tensor::dense(DType::kF32, {rows, cols}, src.data());
      if (c == 0) {
        (m == 0 ? pl->layer.w.gate : m == 1 ? pl->layer.w.up : pl->layer.w.down).push_back(t);
      }
      const uint64_t bytes = matrix_bytes(m);
      if (first[i] != nullptr) {
        std::copy_n(first[i], bytes, at);
      } else if (fp8) {
        pl->fp8_scales[i].resize(static_cast<size_t>((rows + 127) / 128 * ((cols + 127) / 128)));
        quantize_fp8_blocks(src.data(), rows, cols, 128, 128, at, pl->fp8_scales[i].data());
        first[i] = at;
      } else {
        kern::pack_weight_into(ops::Weight(t), f, 128, at, &pool());
        first[i] = at;
      }
      kern::KMatrix km;
      if (fp8) {
        ops::Weight w(Tensor::dense(DType::kF8E4M3, {rows, cols}, at));
        w.scale_inv = pl->fp8_scales[i].data();
        w.scale_cols = (cols + 127) / 128;
        w.block_rows = w.block_cols = 128;
        pl->fp8_weights.push_back(w);
        kern::fp8_view(pl->fp8_weights.back(), &km);
      } else {
        km = kern::packed_view(f, rows, cols, 128, at, nullptr);
      }
      (m == 0 ? pl->ce.gate : m == 1 ? pl->ce.up : pl->ce.down)[static_cast<size_t>(c)]
          .push_back(km);
      at += bytes;
    }
  }
  return pl;
}

// vs_native: the vs_native counter; x4_off (non-null): x4_vs_rows, this layer against these experts
// (the same but the downs as stored rows), A/B in the same minute. peak: the compute peak a
// prefill's of_peak compares with (bench/dram_probe.h report_peak).
// The layer's copies (layer->copies) are cycled call by call: ce's layers 0 .. (a packed or
// repacked layer's), or layer->w_copies as the request's experts (the stored GGUF rows).
void run_layer(benchmark::State& state, const Shape& s, const Layer* layer, const CpuExperts* ce,
               int64_t tokens, bool vs_native = false, const CpuExperts* x4_off = nullptr,
               cpu::ComputeKind peak = cpu::ComputeKind::kInt8Dot);

void BM_MoeLayerPacked(benchmark::State& state, Shape s, kern::WFormat f, int64_t tokens) {
  static std::vector<std::pair<kern::WFormat, PackedLayer*>> cache;
  PackedLayer* pl = nullptr;
  for (auto& [format, l] : cache) {
    if (format == f) pl = l;
  }
  if (pl == nullptr) {
    for (auto& [format, l] : cache) delete l;  // one packed layer alive at a time (memory)
    cache.clear();
    pl = make_packed_layer(s, f);
    cache.emplace_back(f, pl);
  }
  const bool integer = f == kern::WFormat::kInt4 || f == kern::WFormat::kInt8;
  run_layer(state, s, &pl->layer, &pl->ce, tokens, false, nullptr,
            integer ? cpu::ComputeKind::kInt8Dot : cpu::ComputeKind::kBf16Dot);
}

bool same_shape(const Shape& a, const Shape& b) {
  return a.hidden == b.hidden && a.ff == b.ff && a.n_experts == b.n_experts &&
         a.gate_up == b.gate_up && a.down == b.down;
}

const Layer* gguf_layer(const Shape& s) {
  static std::vector<std::pair<Shape, Layer>>* cache = new std::vector<std::pair<Shape, Layer>>;
  for (auto& [shape, l] : *cache) {
    if (same_shape(shape, s)) return &l;
  }
  cache->emplace_back(s, make_layer(s));
  return &cache->back().second;
}

void BM_MoeLayer(benchmark::State& state, Shape s, int64_t tokens) {
  run_layer(state, s, gguf_layer(s), nullptr, tokens);
}

// BM_MoeLayer's experts as `--cpu-experts repack` holds them: the Q4_K matrices rearranged into
// x16 tiles (ops/cpu/q4k_x16.h), the Q5_0 / Q8_0 downs into x4 rows (ops/cpu/q0_x4.h) where the
// CPU has VBMI, in one huge-page buffer. vs_native: this layer's rate / the stored rows'
// (BM_MoeLayer's), A/B in the same minute (bench/dram_probe.h, ab_rounds); x4_vs_rows: the same
// against these experts with the downs as stored rows (the x4 layout's own share).
void BM_MoeLayerRepack(benchmark::State& state, Shape s, int64_t tokens) {
  static std::vector<std::pair<Shape, std::pair<AlignedBuffer, CpuExperts>>>* cache =
      new std::vector<std::pair<Shape, std::pair<AlignedBuffer, CpuExperts>>>;
  // Per shape: the same experts with the downs as stored rows (x4_vs_rows).
  static std::vector<CpuExperts>* rows_down = new std::vector<CpuExperts>;
  const Layer* layer = gguf_layer(s);
  CpuExperts* ce = nullptr;
  const CpuExperts* x4_off = nullptr;
  for (size_t i = 0; i < cache->size(); ++i) {
    if (same_shape((*cache)[i].first, s)) {
      ce = &(*cache)[i].second.second;
      x4_off = &(*rows_down)[i];
    }
  }
  if (ce == nullptr) {
    const size_t copies = static_cast<size_t>(layer->copies);
    cache->emplace_back(s, std::pair<AlignedBuffer, CpuExperts>{
                               weight_buffer(static_cast<size_t>(layer->expert_bytes *
                                                                 s.n_experts * layer->copies)),
                               CpuExperts{}});
    AlignedBuffer& buf = cache->back().second.first;
    ce = &cache->back().second.second;
    ce->gate.resize(copies);
    ce->up.resize(copies);
    ce->down.resize(copies);
    uint8_t* at = buf.as<uint8_t>();
    for (size_t c = 0; c < copies; ++c) {
      const ExpertWeights& lw = layer->w_copies[c];
      for (int64_t e = 0; e < s.n_experts; ++e) {
        for (int m = 0; m < 3; ++m) {
          const auto& w = (m == 0 ? lw.gate : m == 1 ? lw.up : lw.down)[e];
          kern::KMatrix km;
          kern::view_weight(w, &km);
          kern::WFormat x4;
          if (km.format == kern::WFormat::kQ4_K) {
            kern::q4k_x16_repack(km.data, km.row_bytes, km.rows, km.cols, at);
            km.format = kern::WFormat::kQ4_KX16;
            km.data = at;
            at += km.bytes();
          } else if (kern::q0_x4_native() && kern::q0_x4_format(km.format, &x4)) {
            for (int64_t r = 0; r < km.rows; ++r) {
              kern::q0_x4_repack_row(km.format, km.data + r * km.row_bytes, km.cols / kQK,
                                     at + r * km.row_bytes);
            }
            km.format = x4;
            km.data = at;
            at += km.bytes();
          }
          (m == 0 ? ce->gate : m == 1 ? ce->up : ce->down)[c].push_back(km);
        }
      }
    }
    CpuExperts off = *ce;
    for (size_t c = 0; c < copies; ++c) {
      for (int64_t e = 0; e < s.n_experts; ++e) {
        kern::view_weight(layer->w_copies[c].down[e], &off.down[c][e]);
      }
    }
    rows_down->push_back(std::move(off));
    x4_off = &rows_down->back();
  }
  const bool x4 = ce->down[0][0].format != x4_off->down[0][0].format;
  run_layer(state, s, layer, ce, tokens, /*vs_native=*/true, x4 ? x4_off : nullptr);
}

// A layer call's inputs: tokens x hidden random activations, 16 routings to cycle (each token's k
// distinct experts), equal routing weights.
struct Inputs {
  std::vector<float> x, w;
  std::vector<std::vector<int32_t>> routings;
};
Inputs make_inputs(const Shape& s, int64_t tokens) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Inputs in;
  in.x.resize(static_cast<size_t>(tokens * s.hidden));
  for (float& v : in.x) v = nd(rng);
  in.routings.resize(16);
  std::vector<int32_t> perm(static_cast<size_t>(s.n_experts));
  for (auto& ids : in.routings) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t e = 0; e < s.n_experts; ++e) perm[e] = static_cast<int32_t>(e);
      std::shuffle(perm.begin(), perm.end(), rng);
      ids.insert(ids.end(), perm.begin(), perm.begin() + s.k);
    }
  }
  in.w.assign(static_cast<size_t>(tokens * s.k), 1.0f / static_cast<float>(s.k));
  return in;
}

// BM_MoeLayerShared: the V2-Lite layer with its two shared experts (one FFN of 2816: Q4_K gate /
// up, Q6_K down, as in the Q4_K_M file's "more bits" layers), in 8 copies cycled with the routings
// so they come from DRAM as each layer's own do. Decode as Model::ffn runs it on the CPU: the
// fused operator computing the shared experts in its own task queue (FusedMoeOptions::
// shared_experts); of_dram counts routed + shared bytes. vs_model: that against the operator on
// the routed experts alone while the caller computes the shared ones through the pool
// (kern::matmul_shared_input, SwiGLU, kern::matmul: Model::dense_ffn) and adds them after wait(),
// A/B in the same minute (ab_rounds). Both give the same bits (asserted here once). Prefill (512
// tokens): items_per_second = 2 x multiply-adds of routed + shared experts, vs_model likewise.
void BM_MoeLayerShared(benchmark::State& state, Shape s, int64_t tokens) {
  const Layer* layer = gguf_layer(s);
  constexpr int kCopies = 8;
  const int64_t sff = 2 * s.ff;
  static std::vector<std::vector<uint8_t>>* bytes = new std::vector<std::vector<uint8_t>>;
  static std::vector<LayerWeights>* lws = new std::vector<LayerWeights>;
  static uint64_t shared_bytes = 0;
  if (lws->empty()) {
    std::mt19937 rng(9);
    auto quantized = [&](DType dt, int64_t rows, int64_t cols) {
      bytes->push_back(random_quantized(dt, rows, cols, rng));
      return Tensor::dense(dt, {rows, cols}, bytes->back().data());
    };
    bytes->reserve(3 * kCopies);
    for (int c = 0; c < kCopies; ++c) {
      LayerWeights lw;
      lw.moe = true;
      lw.experts = layer->w;
      lw.sh_gate = ops::Weight(quantized(DType::kQ4_K, sff, s.hidden));
      lw.sh_up = ops::Weight(quantized(DType::kQ4_K, sff, s.hidden));
      lw.sh_down = ops::Weight(quantized(DType::kQ6_K, s.hidden, sff));
      lws->push_back(std::move(lw));
    }
    shared_bytes = dtype_bytes(DType::kQ4_K, s.hidden) * 2 * sff +
                   dtype_bytes(DType::kQ6_K, sff) * s.hidden;
  }
  const Inputs in = make_inputs(s, tokens);
  const std::vector<float>& x = in.x;
  const std::vector<std::vector<int32_t>>& routings = in.routings;
  std::vector<float> out(x.size()), sh(x.size());
  FusedMoeOptions with;
  with.shared_experts = true;
  FusedMoeBackend fused(&pool(), with), routed_only(&pool());
  MoeRequest r;
  r.hidden = x.data();
  r.n_tokens = tokens;
  r.hidden_size = s.hidden;
  r.weights = in.w.data();
  r.k = s.k;
  r.experts = &layer->w;
  std::vector<float> g(static_cast<size_t>(tokens * sff)), u(g.size());
  size_t i = 0;
  auto next = [&] {
    r.ids = routings[i % routings.size()].data();
    r.layer_weights = &(*lws)[i % kCopies];
    ++i;
  };
  auto step_fused = [&] {
    next();
    r.out = out.data();
    fused.submit(r);
    fused.wait();
  };
  auto step_model = [&] {
    next();
    r.out = sh.data();
    routed_only.submit(r);
    const ops::Weight* ws[2] = {&r.layer_weights->sh_gate, &r.layer_weights->sh_up};
    float* ys[2] = {g.data(), u.data()};
    kern::matmul_shared_input(ws, x.data(), tokens, ys, &pool());
    ops::swiglu(g.data(), u.data(), tokens * sff, g.data());
    kern::matmul(r.layer_weights->sh_down, g.data(), tokens, out.data(), &pool());
    routed_only.wait();
    for (size_t c = 0; c < out.size(); ++c) out[c] += sh[c];
  };
  step_model();
  const std::vector<float> want = out;
  i = 0;
  step_fused();
  if (out != want) state.SkipWithError("the fused shared experts differ from Model::dense_ffn's");
  auto step = [&] {
    step_fused();
    std::vector<uint8_t> used(static_cast<size_t>(s.n_experts), 0);
    for (int64_t j = 0; j < tokens * s.k; ++j) used[r.ids[j]] = 1;
    return static_cast<uint64_t>(std::count(used.begin(), used.end(), 1)) * layer->expert_bytes +
           shared_bytes;
  };
  uint64_t total = 0;
  for (auto _ : state) total += step();
  state.SetBytesProcessed(static_cast<int64_t>(total));
  state.counters["GBps"] =
      benchmark::Counter(static_cast<double>(total) * 1e-9, benchmark::Counter::kIsRate);
  // Prefill: 2 x multiply-adds of the routed and the shared experts per second.
  const int64_t ops_per_call = 2 * tokens * 3 * s.hidden * (s.k * s.ff + sff);
  state.SetItemsProcessed(state.iterations() * ops_per_call);
  if (tokens > 1) {
    report_peak(state, &pool(), cpu::ComputeKind::kInt8Dot, static_cast<uint64_t>(ops_per_call),
                step);
  }
  if (tokens == 1) {
    static DramProbe probe(&pool());
    const Paired o = paired_rounds(probe, step);
    state.counters["dram_GBps"] = o.probe_rate;
    state.counters["of_dram"] = o.ratio;
  }
  state.counters["vs_model"] = ab_rounds(step_model, step_fused);
  if (tokens == 1) {
    // early_vs_late: the step as Model::ffn runs it -- the F32 router (64 x hidden, one per
    // copy) on the pool, then submit -- with the operator's shared expert begun before the router
    // (MoeBackend::begin) against after it, A/B in the same minute (the routing is the
    // precomputed one either way: the router's result only costs time here).
    static std::vector<std::vector<float>>* routers = new std::vector<std::vector<float>>;
    if (routers->empty()) {
      std::mt19937 rng(11);
      std::normal_distribution<float> nd(0.0f, 0.02f);
      for (int c = 0; c < kCopies; ++c) {
        routers->emplace_back(static_cast<size_t>(s.n_experts * s.hidden));
        for (float& v : routers->back()) v = nd(rng);
      }
    }
    std::vector<float> logits(static_cast<size_t>(s.n_experts));
    auto step_router = [&](bool early) {
      next();
      r.out = out.data();
      MoeRequest b = r;
      b.ids = nullptr;
      b.weights = nullptr;
      if (early) fused.start_shared(b);
      float* rw = (*routers)[(i - 1) % kCopies].data();
      kern::matmul(ops::Weight(Tensor::dense(DType::kF32, {s.n_experts, s.hidden}, rw)), x.data(),
                   1, logits.data(), &pool());
      fused.submit(r);
      fused.wait();
    };
    state.counters["early_vs_late"] =
        ab_rounds([&] { step_router(false); }, [&] { step_router(true); });
  }
  state.counters["threads"] = pool().size() + 1;
}

void run_layer(benchmark::State& state, const Shape& s, const Layer* layer, const CpuExperts* ce,
               int64_t tokens, bool vs_native, const CpuExperts* x4_off, cpu::ComputeKind peak) {
  const int64_t copies = layer->copies;
  const Inputs in = make_inputs(s, tokens);
  const std::vector<float>& x = in.x;
  const std::vector<std::vector<int32_t>>& routings = in.routings;
  std::vector<float> out(x.size());
  // TANDEM_BENCH_MOE_ROWS=N: FusedMoeOptions::max_rows_per_task and max_rows_per_task_decode.
  FusedMoeOptions opt;
  if (const char* rows = std::getenv("TANDEM_BENCH_MOE_ROWS")) {
    opt.max_rows_per_task = opt.max_rows_per_task_decode = std::atoll(rows);
  }
  FusedMoeBackend be(&pool(), opt, ce);
  MoeRequest r;
  r.experts = &layer->w;
  r.hidden = x.data();
  r.n_tokens = tokens;
  r.hidden_size = s.hidden;
  r.weights = in.w.data();
  r.k = s.k;
  r.out = out.data();
  size_t i = 0;
  // One call on backend b; returns the bytes of the distinct experts it read.
  auto step_on = [&](FusedMoeBackend& b) {
    r.layer = static_cast<int64_t>(i % static_cast<size_t>(copies));
    if (!layer->w_copies.empty()) r.experts = &layer->w_copies[static_cast<size_t>(r.layer)];
    const std::vector<int32_t>& ids = routings[i++ % routings.size()];
    r.ids = ids.data();
    b.submit(r);
    b.wait();
    std::vector<uint8_t> used(static_cast<size_t>(s.n_experts), 0);
    for (int32_t e : ids) used[e] = 1;
    return static_cast<uint64_t>(std::count(used.begin(), used.end(), 1)) * layer->expert_bytes;
  };
  auto step = [&] { return step_on(be); };
  uint64_t bytes = 0;
  for (auto _ : state) bytes += step();
  // bytes_per_second is in 2^30 units where Google Benchmark prints "G/s"; GBps is 1e9-based,
  // the unit of `tandem roofline`.
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["GBps"] = benchmark::Counter(static_cast<double>(bytes) * 1e-9,
                                              benchmark::Counter::kIsRate);
  const int64_t ops_per_call = 2 * tokens * s.k * 3 * s.hidden * s.ff;
  state.SetItemsProcessed(state.iterations() * ops_per_call);
  // of_peak: the median over 8 paired rounds (the layer, then one pass of the compute peak's
  // kernel) of layer G op/s / peak G op/s; peak_Gops: the peak's median; the label names it.
  if (tokens > 1) report_peak(state, &pool(), peak, static_cast<uint64_t>(ops_per_call), step);
  // TANDEM_BENCH_MOE_ROWS_B=N: b_vs_a, the layer with max_rows_per_task (and the decode cap) N
  // against the one above, A/B in the same minute (ab_rounds; the routings cycle through both).
  if (const char* rows_b = std::getenv("TANDEM_BENCH_MOE_ROWS_B")) {
    FusedMoeOptions opt_b = opt;
    opt_b.max_rows_per_task = opt_b.max_rows_per_task_decode = std::atoll(rows_b);
    FusedMoeBackend be_b(&pool(), opt_b, ce);
    state.counters["b_vs_a"] = ab_rounds([&] { step_on(be); }, [&] { step_on(be_b); });
  }
  // whole_vs_chunked: the layer as run (a prefill's experts as whole-expert tasks,
  // FusedMoeOptions::whole_experts_per_thread) against every expert in row chunks, A/B in the same
  // minute.
  if (tokens > 4) {
    FusedMoeOptions chunked = opt;
    chunked.whole_experts_per_thread = 0;
    FusedMoeBackend be_c(&pool(), chunked, ce);
    state.counters["whole_vs_chunked"] = ab_rounds([&] { step_on(be_c); }, [&] { step_on(be); });
  }
  if (tokens == 1) {
    // of_dram: the median over 8 paired rounds (~20 ms of the layer, then one DRAM probe pass,
    // bench/dram_probe.h) of layer GB/s / probe GB/s; dram_GBps: the probe's median.
    static DramProbe probe(&pool());
    const Paired r = paired_rounds(probe, step);
    state.counters["dram_GBps"] = r.probe_rate;
    state.counters["of_dram"] = r.ratio;
    // TANDEM_BENCH_MOE_TAIL_B=N: b_vs_a with FusedMoeOptions::tail_pieces N against the default.
    if (const char* tail_b = std::getenv("TANDEM_BENCH_MOE_TAIL_B")) {
      FusedMoeOptions opt_b = opt;
      opt_b.tail_pieces = std::atoi(tail_b);
      FusedMoeBackend be_b(&pool(), opt_b, ce);
      state.counters["tail_b_vs_a"] = ab_rounds([&] { step_on(be); }, [&] { step_on(be_b); });
    }
    if (vs_native) {
      FusedMoeBackend native(&pool(), opt, nullptr);
      state.counters["vs_native"] = ab_rounds([&] { step_on(native); }, [&] { step_on(be); });
    }
  }
  if (x4_off != nullptr) {  // (prefill too: its tiles read the x4 rows unpacked)
    FusedMoeBackend rows(&pool(), opt, x4_off);
    state.counters["x4_vs_rows"] = ab_rounds([&] { step_on(rows); }, [&] { step_on(be); });
  }
  state.counters["threads"] = pool().size() + 1;
  state.counters["layer_copies"] = static_cast<double>(copies);
}

const Shape kV2Lite{2048, 1408, 64, 6, DType::kQ4_K, DType::kQ5_0};
const Shape kQwen3{2048, 768, 128, 8, DType::kQ4_K, DType::kQ4_K};
// V2-Lite's "more bits" layers (12 of its 26 MoE layers in the Q4_K_M file): Q8_0 downs.
const Shape kV2LiteQ8{2048, 1408, 64, 6, DType::kQ4_K, DType::kQ8_0};

BENCHMARK_CAPTURE(BM_MoeLayer, v2lite_decode, kV2Lite, 1)->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(BM_MoeLayer, v2lite_prefill512, kV2Lite, 512)->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(BM_MoeLayer, qwen3_30b_a3b_decode, kQwen3, 1)->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(BM_MoeLayer, v2lite_q8down_decode, kV2LiteQ8, 1)->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(BM_MoeLayer, qwen3_30b_a3b_prefill512, kQwen3, 512)->UseRealTime()->MinTime(0.5);

BENCHMARK_CAPTURE(BM_MoeLayerRepack, v2lite_decode, kV2Lite, 1)->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(BM_MoeLayerRepack, v2lite_prefill512, kV2Lite, 512)->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(BM_MoeLayerRepack, qwen3_30b_a3b_decode, kQwen3, 1)->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(BM_MoeLayerRepack, v2lite_q8down_decode, kV2LiteQ8, 1)
    ->UseRealTime()
    ->MinTime(0.5);
BENCHMARK_CAPTURE(BM_MoeLayerRepack, qwen3_30b_a3b_prefill512, kQwen3, 512)
    ->UseRealTime()
    ->MinTime(0.5);

BENCHMARK_CAPTURE(BM_MoeLayerShared, v2lite_decode, kV2Lite, 1)->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(BM_MoeLayerShared, v2lite_prefill512, kV2Lite, 512)
    ->UseRealTime()
    ->MinTime(0.5);

#define TD_PACKED_LAYER(f, name)                                                    \
  BENCHMARK_CAPTURE(BM_MoeLayerPacked, v2lite_##name##_decode, kV2Lite, f, 1)       \
      ->UseRealTime()                                                               \
      ->MinTime(0.5);                                                               \
  BENCHMARK_CAPTURE(BM_MoeLayerPacked, v2lite_##name##_prefill512, kV2Lite, f, 512) \
      ->UseRealTime()                                                               \
      ->MinTime(0.5)
TD_PACKED_LAYER(kern::WFormat::kInt4, int4);
TD_PACKED_LAYER(kern::WFormat::kInt8, int8);
TD_PACKED_LAYER(kern::WFormat::kBF16Tile, bf16);
TD_PACKED_LAYER(kern::WFormat::kFP8Block, fp8);

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
