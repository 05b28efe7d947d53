// The CUDA device (runtime/cuda_device.cpp) against the Device contract (runtime/device.h) and
// the CPU reference: callbacks in stream order, events ordering two streams, copies round trip,
// the budget's error naming the flag, a callback's exception surfacing once at the next sync,
// host pointers refused; the expert FFN (plain, scaled + accumulated, gpt-oss's biases and clamp)
// and matmul over F32, Q8_0, Q4_K / Q6_K and block-scaled FP8 weights of odd sizes within F32
// rounding of ops::swiglu_ffn / ops::matmul (the device sums in another order); and end to end,
// `tandem run --accel cuda` (the dense part on the GPU too) on models `tandem synth` writes here
// gives `--accel none`'s tokens, and a batch of sequences through `tandem bench --batch`; decode
// steps replayed from CUDA graphs equal the steps run op by op; a hybrid model's turns through the
// sequence memory on the GPU give the CPU's tokens.
// Label gpu: skipped (exit 77) without a GPU (tests/gpu/gpu_gate.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tests/gpu/gpu_gate.h"

#ifdef TANDEM_HAVE_CUDA
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "formats/quant.h"
#include "model/model.h"
#include "moe/fused_moe.h"
#include "ops/cpu/ref_ops.h"
#include "runtime/dense_weights.h"
#include "runtime/device.h"
#include "tests/graph_replay_check.h"
#include "tests/step_graph_check.h"
#include "tests/test_util.h"

namespace tandem::rt {
namespace {

std::unique_ptr<Device> gpu(uint64_t budget = uint64_t{256} << 20) {
  CudaDeviceOptions o;
  o.memory_bytes = budget;
  return make_cuda_device(o);
}

TEST(CudaDevice, CallbacksEventsCopies) {
  auto dev = gpu();
  const StreamId a = 0, b = dev->create_stream();
  std::vector<int> order;
  std::atomic<bool> slow_done{false};
  for (int i = 0; i < 4; ++i) dev->host_callback(a, [&order, i] { order.push_back(i); });
  dev->host_callback(a, [&slow_done] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    slow_done = true;
  });
  const EventId e = dev->create_event();
  EXPECT_TRUE(dev->query(e));  // never recorded
  dev->record(e, a);
  dev->wait_event(b, e);
  bool seen = false;
  dev->host_callback(b, [&] { seen = slow_done.load(); });
  dev->sync_stream(b);
  EXPECT_TRUE(seen);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  std::vector<float> src(1000), back(1000, 0.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f - 7.0f;
  void* d = dev->alloc(src.size() * 4);
  float* pinned = static_cast<float*>(dev->alloc_host(src.size() * 4));
  std::copy(src.begin(), src.end(), pinned);
  dev->copy_h2d(d, pinned, src.size() * 4, a);
  dev->copy_d2h(back.data(), d, src.size() * 4, a);
  dev->sync_stream(a);
  EXPECT_EQ(back, src);
  dev->free(d);
  dev->free_host(pinned);
}

TEST(CudaDevice, BudgetErrorsAndBadArguments) {
  auto dev = gpu(uint64_t{1} << 20);
  EXPECT_EQ(dev->memory_capacity(), uint64_t{1} << 20);
  void* p = dev->alloc(512 << 10);
  EXPECT_EQ(dev->memory_used(), uint64_t{512} << 10);
  try {
    dev->alloc(768 << 10);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource);
    EXPECT_NE(std::string(e.what()).find("--vram-budget"), std::string::npos) << e.what();
  }
  dev->free(p);
  EXPECT_EQ(dev->memory_used(), 0u);
  void* q = dev->alloc(500 << 10);  // the freed block serves it (runtime/block_pool.h)
  EXPECT_EQ(q, p);
  EXPECT_EQ(dev->memory_used(), uint64_t{512} << 10);
  void* big = dev->alloc(512 << 10);  // the rest of the budget
  dev->free(q);
  dev->free(big);
  int x = 0;
  EXPECT_THROW(dev->free(&x), Error);
  EXPECT_THROW(dev->sync_stream(7), Error);
  std::vector<float> host(16);
  void* d = dev->alloc(64);
  EXPECT_THROW(dev->add(0, host.data(), static_cast<float*>(d), 16), Error);  // host input
  dev->free(d);
}

// A captured CUDA graph (its host node included) replays what eager execution computes.
TEST(CudaDevice, GraphReplayEqualsEagerExecution) {
  auto dev = gpu();
  test::check_graph_replay(*dev);
}

TEST(CudaDevice, CallbackErrorSurfacesOnceAndTheStreamGoesOn) {
  auto dev = gpu();
  dev->host_callback(0, [] { fail(ErrorKind::kInvalidArgument, "boom"); });
  int after = 0;
  dev->host_callback(0, [&after] { after = 1; });
  try {
    dev->sync_stream(0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
  }
  EXPECT_EQ(after, 1);
  EXPECT_NO_THROW(dev->sync_stream(0));
}

// A random [rows, cols] weight of `dt` (FP8: E4M3 with 128 x 128 block scales, partial edge
// blocks) in host memory; `store` owns the bytes.
ops::Weight random_weight(DType dt, int64_t rows, int64_t cols, std::mt19937& rng,
                          std::vector<std::vector<uint8_t>>& store,
                          std::vector<std::vector<float>>& scales) {
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> f(static_cast<size_t>(rows * cols));
  for (float& v : f) v = nd(rng);
  const DType stored = dt;
  const int64_t rb = dtype_bytes(stored, cols);
  store.emplace_back(static_cast<size_t>(rows * rb));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(stored, f.data() + r * cols, store.back().data() + r * rb, cols);
  }
  ops::Weight w(Tensor::dense(stored, {rows, cols}, store.back().data()));
  if (dt == DType::kF8E4M3) {
    const int64_t br = 128, bc = 128, sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    scales.emplace_back(static_cast<size_t>(sr * sc));
    std::uniform_real_distribution<float> u(0.5f, 2.0f);
    for (float& s : scales.back()) s = u(rng);
    w.scale_inv = scales.back().data();
    w.scale_cols = sc;
    w.block_rows = br;
    w.block_cols = bc;
  }
  return w;
}

struct Owned {
  Device& dev;
  std::vector<void*> p;
  ~Owned() {
    for (void* q : p) dev.free(q);
  }
  void* copy(const void* src, uint64_t bytes) {
    void* d = dev.alloc(bytes);
    p.push_back(d);
    dev.copy_h2d(d, src, bytes, 0);
    return d;
  }
  ops::Weight weight(const ops::Weight& w, int64_t scale_floats) {
    ops::Weight out = w;
    out.t.data = copy(w.t.data, static_cast<uint64_t>(w.t.row_bytes() * w.rows()));
    if (w.scale_inv != nullptr) {
      out.scale_inv = static_cast<const float*>(copy(w.scale_inv, uint64_t(scale_floats) * 4));
    }
    return out;
  }
};

struct OpsCase {
  DType gate, down;
  int64_t hidden, ff;
  bool extras;
  int64_t tokens = 5;  // >= 32: the products go through cuBLAS (prefill)
};

class CudaDeviceOps : public ::testing::TestWithParam<OpsCase> {};

TEST_P(CudaDeviceOps, MatchTheCpuReference) {
  const OpsCase c = GetParam();
  const int64_t H = c.hidden, F = c.ff, T = c.tokens;
  std::mt19937 rng(3);
  std::vector<std::vector<uint8_t>> store;
  std::vector<std::vector<float>> scales;
  const ops::Weight gw = random_weight(c.gate, F, H, rng, store, scales);
  const ops::Weight uw = random_weight(c.gate, F, H, rng, store, scales);
  const ops::Weight dw = random_weight(c.down, H, F, rng, store, scales);
  auto scale_floats = [](const ops::Weight& w) {
    return w.scale_inv == nullptr ? 0 : (w.rows() + w.block_rows - 1) / w.block_rows * w.scale_cols;
  };
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(T * H), scale(T), base(T * H);
  for (float& v : x) v = nd(rng);
  for (float& v : scale) v = nd(rng);
  for (float& v : base) v = nd(rng);
  std::vector<float> gb(F), ub(F), db(H);
  for (auto* v : {&gb, &ub, &db}) {
    for (float& f : *v) f = nd(rng);
  }
  ops::FfnExtras hx;
  if (c.extras) {
    hx.gate_bias = gb.data();
    hx.up_bias = ub.data();
    hx.down_bias = db.data();
    hx.limit = 0.5f;
  }
  // The reference: ops::swiglu_ffn (weights dequantized, F32 products), scaled and accumulated.
  std::vector<float> y(T * H), g, u, want(base), mm_want(T * F);
  ops::swiglu_ffn(gw, uw, dw, x.data(), T, y.data(), nullptr, &g, &u, hx);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < H; ++i) want[t * H + i] += scale[t] * y[t * H + i];
  }
  ops::matmul(gw, x.data(), T, mm_want.data(), nullptr);

  auto dev = gpu();
  Owned own{*dev, {}};
  DeviceFfnWeights w;
  w.gate = own.weight(gw, scale_floats(gw));
  w.up = own.weight(uw, scale_floats(uw));
  w.down = own.weight(dw, scale_floats(dw));
  if (c.extras) {
    w.extras.gate_bias = static_cast<const float*>(own.copy(gb.data(), F * 4));
    w.extras.up_bias = static_cast<const float*>(own.copy(ub.data(), F * 4));
    w.extras.down_bias = static_cast<const float*>(own.copy(db.data(), H * 4));
    w.extras.limit = 0.5f;
  }
  auto* dx = static_cast<float*>(own.copy(x.data(), x.size() * 4));
  auto* ds = static_cast<float*>(own.copy(scale.data(), scale.size() * 4));
  auto* dacc = static_cast<float*>(own.copy(base.data(), base.size() * 4));
  auto* dplain = static_cast<float*>(own.copy(base.data(), base.size() * 4));
  auto* dmm = static_cast<float*>(own.copy(mm_want.data(), mm_want.size() * 4));
  const StreamId s = dev->create_stream();
  dev->sync_stream(0);
  dev->ffn(s, w, dx, T, ds, dacc, true);
  dev->ffn(s, w, dx, T, nullptr, dplain, false);
  dev->matmul(s, w.gate, dx, T, dmm);
  std::vector<float> acc(base.size()), plain(base.size()), mm(mm_want.size());
  dev->copy_d2h(acc.data(), dacc, acc.size() * 4, s);
  dev->copy_d2h(plain.data(), dplain, plain.size() * 4, s);
  dev->copy_d2h(mm.data(), dmm, mm.size() * 4, s);
  dev->sync_stream(s);
  // BF16 prefill "at F32 accuracy" is three BF16 products (hi*hi + hi*lo + lo*hi); measured on
  // an H100 at these shapes: three parts ~3e-7, two ~4e-6, one ~3e-3. Its bound is the three
  // parts' error with a 5x margin, below what dropping the smallest product gives.
  const bool bf16_prefill = c.gate == DType::kBF16 && T >= 32;
  const double bound = bf16_prefill ? 1.5e-6 : 1e-5;
  EXPECT_LE(test::max_rel_diff(acc, want), bound);
  EXPECT_LE(test::max_rel_diff(plain, y), bound);
  EXPECT_LE(test::max_rel_diff(mm, mm_want), bound);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, CudaDeviceOps,
    ::testing::Values(OpsCase{DType::kF32, DType::kF32, 67, 45, false},
                      OpsCase{DType::kF32, DType::kF32, 67, 45, true},
                      OpsCase{DType::kQ8_0, DType::kQ8_0, 96, 160, false},
                      OpsCase{DType::kQ4_K, DType::kQ6_K, 256, 512, false},
                      OpsCase{DType::kF8E4M3, DType::kF8E4M3, 200, 136, false},
                      OpsCase{DType::kBF16, DType::kBF16, 67, 45, true},
                      // Prefill: cuBLAS on F32 weights as they are, BF16 ones on tensor
                      // cores (three products), the rest on dequantized slices (FP8: whole
                      // scale blocks).
                      OpsCase{DType::kF32, DType::kF32, 67, 45, true, 40},
                      OpsCase{DType::kBF16, DType::kBF16, 200, 136, true, 40},
                      OpsCase{DType::kQ4_K, DType::kQ6_K, 256, 512, false, 33},
                      OpsCase{DType::kF8E4M3, DType::kF8E4M3, 200, 136, false, 70},
                      // Slices of 64 MiB: 2 and a partial one.
                      OpsCase{DType::kQ8_0, DType::kQ8_0, 4096, 9000, false, 32}));

// `tandem run --accel cuda` (the dense part on the GPU's forward ops, experts pinned and cached
// there) equals `--accel none` (greedy tokens), short and long prompts, on tiny F32 models written
// here (the device computes F32 like the CPU does for F32 weights, in another summation order): GQA
// with q / k norms, MLA absorbed, Qwen2's biases and shared-expert gate, gpt-oss's sinks, window
// and biases, Qwen3-Next's and Qwen3.5's Gated DeltaNet layers and gated attention.
TEST(CudaDeviceCli, RunEqualsTheCpu) {
  test::TempDir dir("cuda_run");
  for (const char* arch :
       {"qwen3moe", "deepseek2", "qwen2moe", "gpt-oss", "qwen3next", "qwen35moe"}) {
    const std::string m = (dir / (std::string(arch) + ".gguf")).string();
    auto r = test::run_tandem(std::string("synth --arch ") + arch +
                              " --preset tiny --format gguf --type f32 --seed 2 -o " + m);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // A short prompt (products on the stored weights) and one of 40 tokens (prefill through
    // cuBLAS).
    std::string long_prompt = "1";
    for (int i = 1; i < 40; ++i) {
      long_prompt += ',';
      long_prompt += std::to_string(1 + i * 7 % 200);
    }
    for (const std::string& prompt : {std::string("1,5,9,13"), long_prompt}) {
      const std::string base = "run --model " + m + " --tokens " + prompt + " -n 12 --temp 0 ";
      const auto cpu = test::run_tandem(base + "--accel none");
      ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
      const auto cuda = test::run_tandem(
          base + "--accel cuda --vram-budget 256M --gpu-experts 2 --policy hybrimoe");
      ASSERT_EQ(cuda.exit_code, 0) << cuda.err;
      EXPECT_EQ(cuda.out, cpu.out) << arch << " prompt " << prompt;
    }
    // 16-bit and Q8_0 KV caches: F16's and Q8_0's arithmetic is F32 on both sides over the same
    // cached values, the same tokens; with BF16 the CPU attends in BF16 arithmetic on AVX-512
    // BF16 CPUs, so only the first token (the prompt's logits) must agree.
    for (const char* type : {"f16", "q8_0", "bf16"}) {
      const std::string base =
          "run --model " + m + " --tokens 1,5,9,13 -n 12 --temp 0 " + "--cache-type " + type + " ";
      const auto cpu = test::run_tandem(base + "--accel none");
      ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
      const auto cuda = test::run_tandem(base + "--accel cuda --vram-budget 256M");
      ASSERT_EQ(cuda.exit_code, 0) << cuda.err;
      if (std::string(type) != "bf16") {
        EXPECT_EQ(cuda.out, cpu.out) << arch << " f16 cache";
      } else {
        EXPECT_EQ(cuda.out.substr(0, cuda.out.find(' ')), cpu.out.substr(0, cpu.out.find(' ')))
            << arch << " bf16 cache";
      }
    }
    // The decode's timeline and time split come from the GPU's own event spans.
    const auto timed = test::run_tandem("bench -m " + m +
                                        " -p 8 -n 4 -r 1 --accel cuda --vram-budget 256M --json");
    ASSERT_EQ(timed.exit_code, 0) << timed.err;
    const nlohmann::json j = nlohmann::json::parse(timed.out);
    const nlohmann::json& tg = j["tests"][1];
    EXPECT_GT(tg["timeline"]["device_busy"].get<double>(), 0.0) << tg.dump();
    EXPECT_LE(tg["timeline"]["device_busy"].get<double>(), 1.0) << tg.dump();
    EXPECT_GT(tg["time_split"]["attention"].get<double>(), 0.0) << tg.dump();
    EXPECT_GT(tg["time_split"]["lm_head"].get<double>(), 0.0) << tg.dump();
    // Its trace has the GPU's kernels and copies on the CUDA stream's own track, timed by events.
    const std::string trace_path = (dir / (std::string(arch) + ".trace.json")).string();
    const auto traced = test::run_tandem("bench -m " + m +
                                         " -p 8 -n 4 -r 1 --accel cuda --vram-budget 256M "
                                         "--timeline " + trace_path);
    ASSERT_EQ(traced.exit_code, 0) << traced.err;
    std::ifstream trace_file(trace_path);
    const nlohmann::json trace = nlohmann::json::parse(trace_file);
    std::map<int, std::string> tracks;
    std::map<std::string, int> gpu_spans;  // name -> count, on a "cuda stream" track
    for (const auto& e : trace["traceEvents"]) {
      if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"]] = e["args"]["name"];
    }
    for (const auto& e : trace["traceEvents"]) {
      if (e["ph"] != "X" || tracks[e["tid"].get<int>()].rfind("cuda stream", 0) != 0) continue;
      EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
      ++gpu_spans[e["name"].get<std::string>()];
    }
    for (const char* op : {"attention", "router", "LM head", "copy host to device"}) {
      EXPECT_GT(gpu_spans[op], 0) << arch << ": no " << op << " span on a CUDA stream's track";
    }
    // Several sequences in one forward (block tables, per-part attention) run too.
    const auto batch = test::run_tandem("bench -m " + m +
                                        " --batch 1,3 -p 8 -n 4 -r 1 --accel "
                                        "cuda --vram-budget 256M");
    EXPECT_EQ(batch.exit_code, 0) << batch.err;
  }
}

// Decode steps replayed from CUDA graphs (the step's values staged in pinned memory, attention
// reading each part's first position from device memory, the MoE layers' submit and wait as host
// nodes) equal the same steps run op by op bit for bit, batch sizes 1 to 8, on tiny models
// written here (tests/step_graph_check.h); and `tandem run` through them gives the CPU's tokens.
TEST(CudaStepGraphs, ReplaysEqualTheStepsRunOpByOp) {
  test::TempDir dir("cuda_graphs");
  for (const char* arch : {"qwen3moe", "deepseek2", "qwen2moe", "gpt-oss"}) {
    SCOPED_TRACE(arch);
    const std::string m = (dir / (std::string(arch) + ".gguf")).string();
    auto r = test::run_tandem(std::string("synth --arch ") + arch +
                              " --preset tiny --format gguf --type q4_k_m --seed 3 -o " + m);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    {
      const LoadedModel lm = load_model(m);
      auto dev = gpu();
      auto w = upload_dense_weights(*dev, lm, true);
      Device* d = dev.get();
      ThreadingContext threading(ThreadingOptions{2, false, 50});
      FusedMoeBackend moe_a(&threading.pool()), moe_b(&threading.pool());
      auto model = [&](MoeBackend* moe, bool graphs) {
        ModelOptions mo;
        mo.forward.pool = &threading.pool();
        mo.moe = moe;
        mo.graphs = graphs;
        mo.ops = [d, w](const LoadedModel&, const ForwardOpsOptions& o) {
          return d->forward_ops(w, o);
        };
        return std::make_unique<Model>(lm, mo);
      };
      const auto graphed = model(&moe_a, true);
      const auto eager = model(&moe_b, false);
      KvCacheOptions o;
      o.positions = 64 * 16;
      o.max_sequence_positions = 192;
      test::check_step_graphs(*graphed, *eager, o);
    }
    const std::string base = "run --model " + m + " --tokens 1,5,9,13 -n 12 --temp 0 ";
    const auto cpu = test::run_tandem(base + "--accel none");
    ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
    const auto cuda =
        test::run_tandem(base + "--accel cuda --vram-budget 256M --gpu-experts 0 --cache-slots 0");
    ASSERT_EQ(cuda.exit_code, 0) << cuda.err;
    EXPECT_NE(cuda.err.find("replayed as graphs"), std::string::npos) << cuda.err;
    EXPECT_EQ(cuda.out, cpu.out);
  }
}

// A hybrid model (the golden tiny Qwen3.5-MoE) on the GPU's forward ops through the generator: a
// chat's second turn extends the first's whole sequence, the third resumes from a checkpoint of
// the second (a state the kernels copied into its slot, restored by a device copy), then three
// sequences at once, one of them past two interval checkpoints: each answer the CPU's greedy
// tokens for its prompt alone.
TEST(CudaHybrid, TurnsAndBatchesThroughTheSequenceMemoryEqualTheCpu) {
  const LoadedModel lm = load_model(test::data_path("golden/qwen35moe.gguf"));
  auto dev = gpu();
  auto w = upload_dense_weights(*dev, lm, true);
  Device* d = dev.get();
  ThreadingContext threading(ThreadingOptions{2, false, 50});
  FusedMoeBackend moe(&threading.pool());
  ModelOptions mo;
  mo.forward.pool = &threading.pool();
  mo.moe = &moe;
  mo.ops = [d, w](const LoadedModel&, const ForwardOpsOptions& o) {
    return d->forward_ops(w, o);
  };
  Model on_gpu(lm, mo);
  ModelOptions co;
  co.forward.pool = &threading.pool();
  Model on_cpu(lm, co);
  const int64_t vocab = lm.config.vocab_size;
  auto solo = [&](const std::vector<int32_t>& prompt, int n) {
    SingleSequence s(on_cpu, static_cast<int64_t>(prompt.size()) + n + 1);
    std::vector<float> row(static_cast<size_t>(vocab));
    s.forward(prompt, row.data(), false);
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      out.push_back(static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
      s.forward(std::span<const int32_t>(&out.back(), 1), row.data(), false);
    }
    return out;
  };
  KvCacheOptions o;
  o.positions = 64 * 16;
  o.state_slots = 12;
  o.checkpoint_interval = 32;
  KvCache cache(on_gpu.kv_layout(), on_gpu.cache_options(o));
  Generator g(on_gpu, cache, nullptr);
  GenerateParams p;
  p.sampling.temperature = 0;
  p.ignore_eos = true;
  std::mt19937 rng(31);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  auto tokens = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& t : v) t = tok(rng);
    return v;
  };
  // Runs the requests to the end: each one's tokens and cached prompt tokens.
  auto run = [&](const std::vector<std::pair<std::vector<int32_t>, int>>& reqs) {
    std::vector<RequestId> ids;
    for (const auto& [prompt, n] : reqs) {
      p.max_tokens = n;
      ids.push_back(g.submit(prompt, p));
    }
    std::map<RequestId, std::vector<int32_t>> out;
    std::map<RequestId, int64_t> cached;
    while (!g.idle()) {
      for (const GenerateEvent& ev : g.step()) {
        EXPECT_NE(ev.finish, FinishReason::kError) << ev.error;
        if (ev.token >= 0) out[ev.id].push_back(ev.token);
        if (cached.count(ev.id) == 0) cached[ev.id] = g.usage(ev.id).cached;
      }
    }
    std::vector<std::pair<std::vector<int32_t>, int64_t>> r;
    for (RequestId id : ids) r.emplace_back(out[id], cached[id]);
    return r;
  };
  const std::vector<int32_t> p1 = tokens(50);
  const auto a1 = run({{p1, 10}});
  EXPECT_EQ(a1[0].first, solo(p1, 10));
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), a1[0].first.begin(), a1[0].first.end());
  const std::vector<int32_t> turn = tokens(20);
  p2.insert(p2.end(), turn.begin(), turn.end());
  const auto a2 = run({{p2, 8}});
  EXPECT_EQ(a2[0].first, solo(p2, 8));
  EXPECT_EQ(a2[0].second, 59);  // p1 and a1 but its last token
  std::vector<int32_t> p3 = p2;
  const std::vector<int32_t> turn3 = tokens(12);
  p3.insert(p3.end(), turn3.begin(), turn3.end());
  const auto a3 = run({{p3, 6}});
  EXPECT_EQ(a3[0].first, solo(p3, 6));
  EXPECT_EQ(a3[0].second, static_cast<int64_t>(p2.size()) - 1);
  const std::vector<int32_t> q1 = tokens(70), q2 = tokens(5), q3 = tokens(33);
  const auto batch = run({{q1, 7}, {q2, 9}, {q3, 4}});
  EXPECT_EQ(batch[0].first, solo(q1, 7));
  EXPECT_EQ(batch[1].first, solo(q2, 9));
  EXPECT_EQ(batch[2].first, solo(q3, 4));
}

}  // namespace
}  // namespace tandem::rt
#endif

int main(int argc, char** argv) {
  return tandem::test::gpu_test_main(argc, argv);
}
