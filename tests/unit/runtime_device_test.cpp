// runtime/device.h and the host device (runtime/host_device.h): link specifications, stream order,
// events, callbacks, copies paced by the link, the allocator, error propagation, and ops that
// compute exactly what the CPU MoE backend computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "formats/quant.h"
#include "ops/cpu/kernels.h"
#include "runtime/device.h"
#include "runtime/host_device.h"
#include "tests/graph_replay_check.h"

namespace tandem::rt {
namespace {

TEST(RuntimeLink, NamedLinks) {
  LinkSpec p4 = parse_link("pcie4");
  EXPECT_EQ(p4.gb_per_s, 25.0);
  EXPECT_EQ(p4.latency_us, 10.0);
  LinkSpec p5 = parse_link("pcie5");
  EXPECT_EQ(p5.gb_per_s, 50.0);
  EXPECT_EQ(p5.latency_us, 8.0);
  LinkSpec none = parse_link("none");
  EXPECT_EQ(none.gb_per_s, 0.0);
  EXPECT_EQ(none.latency_us, 0.0);
}

TEST(RuntimeLink, Numbers) {
  LinkSpec a = parse_link("12.5");
  EXPECT_EQ(a.gb_per_s, 12.5);
  EXPECT_EQ(a.latency_us, 0.0);
  LinkSpec b = parse_link("32,5");
  EXPECT_EQ(b.gb_per_s, 32.0);
  EXPECT_EQ(b.latency_us, 5.0);
}

TEST(RuntimeLink, BadTextNamesIt) {
  // ... and figures no link has (1e-6 GB/s: emulated copies that would take days).
  for (const char* bad :
       {"", "pcie9", "abc", "-3", "10,", "10,x", "1e999", "0.000001", "1e9", "10,1e12"}) {
    try {
      parse_link(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
    }
  }
}

// ---- the host device ----

std::unique_ptr<Device> device(uint64_t mem = 64 << 20, int threads = 2, LinkSpec link = {}) {
  return make_host_device(HostDeviceOptions{mem, threads, link});
}

TEST(HostDevice, CallbacksRunInOrderOnTheStreamThread) {
  auto dev = device();
  const StreamId s = dev->create_stream();
  std::vector<int> seen;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 50; ++i) {
    dev->host_callback(s, [&, i] {
      seen.push_back(i);
      threads.push_back(std::this_thread::get_id());
    });
  }
  dev->sync_stream(s);
  ASSERT_EQ(seen.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(seen[i], i);
  for (auto id : threads) {
    EXPECT_EQ(id, threads[0]);
    EXPECT_NE(id, std::this_thread::get_id());
  }
}

TEST(HostDevice, EventsOrderStreams) {
  auto dev = device();
  const StreamId a = dev->create_stream(), b = dev->create_stream();
  const EventId e = dev->create_event();
  EXPECT_TRUE(dev->query(e));  // never recorded
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::atomic<int> flag{0};
  dev->host_callback(a, [open] { open.wait(); });
  dev->host_callback(a, [&] { flag = 1; });
  dev->record(e, a);
  dev->wait_event(b, e);
  int seen_by_b = -1;
  dev->host_callback(b, [&] { seen_by_b = flag.load(); });
  const EventId eb = dev->create_event();
  dev->record(eb, b);
  EXPECT_FALSE(dev->query(e));  // a is held by the gate, so b is too
  EXPECT_FALSE(dev->query(eb));
  gate.set_value();
  dev->sync_event(eb);
  EXPECT_EQ(seen_by_b, 1);
  EXPECT_TRUE(dev->query(e));
  // Recording again re-targets the event to the newest point of the stream.
  std::promise<void> gate2;
  std::shared_future<void> open2 = gate2.get_future().share();
  dev->host_callback(a, [open2] { open2.wait(); });
  dev->record(e, a);
  EXPECT_FALSE(dev->query(e));
  gate2.set_value();
  dev->sync_event(e);
  EXPECT_TRUE(dev->query(e));
}

TEST(HostDevice, CopiesRoundTrip) {
  auto dev = device(8 << 20, 1, parse_link("none"));
  std::vector<uint8_t> src(1 << 20), back(1 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  void* d = dev->alloc(src.size());
  dev->copy_h2d(d, src.data(), src.size(), 0);
  dev->copy_d2h(back.data(), d, src.size(), 0);
  dev->sync_stream(0);
  EXPECT_EQ(back, src);
  dev->free(d);
  void* h = dev->alloc_host(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h) % 64, 0u);
  dev->free_host(h);
}

TEST(HostDevice, CopyTimeRespectsTheLink) {
  // Lower bounds only: a loaded machine may be slower, never faster than the link.
  const LinkSpec link{2.0, 200.0};  // 2 GB/s + 200 us
  auto dev = device(8 << 20, 1, link);
  const uint64_t bytes = 4 << 20;
  std::vector<uint8_t> src(bytes, 1), back(bytes, 0);
  void* d = dev->alloc(bytes);
  auto t0 = std::chrono::steady_clock::now();
  dev->copy_h2d(d, src.data(), bytes, 0);
  dev->sync_stream(0);
  const double h2d_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(h2d_s, 0.9 * (bytes / 2e9 + 200e-6));
  // Two streams copying at once share the one h2d link: together at least 2x bytes / bandwidth.
  const StreamId s1 = dev->create_stream();
  void* d2 = dev->alloc(bytes);
  t0 = std::chrono::steady_clock::now();
  dev->copy_h2d(d, src.data(), bytes, 0);
  dev->copy_h2d(d2, src.data(), bytes, s1);
  dev->sync_stream(0);
  dev->sync_stream(s1);
  const double both_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(both_s, 0.9 * (2.0 * bytes / 2e9));
  dev->copy_d2h(back.data(), d2, bytes, s1);
  dev->sync_stream(s1);
  EXPECT_EQ(back, src);
}

TEST(HostDevice, CapacityAndFreeList) {
  auto dev = device(1 << 20, 1);
  EXPECT_EQ(dev->memory_capacity(), 1u << 20);
  void* a = dev->alloc(300000);
  void* b = dev->alloc(300000);
  void* c = dev->alloc(300000);
  EXPECT_GE(dev->memory_used(), 900000u);
  try {
    dev->alloc(600000);
    ADD_FAILURE() << "allocated past capacity";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource);
    EXPECT_NE(std::string(e.what()).find("600000"), std::string::npos) << e.what();
  }
  dev->free(a);
  dev->free(b);  // a and b coalesce into one block large enough
  void* big = dev->alloc(600000);
  EXPECT_EQ(big, a);
  dev->free(big);
  dev->free(c);
  EXPECT_EQ(dev->memory_used(), 0u);
  void* all = dev->alloc(1 << 20);  // everything coalesced back
  EXPECT_NE(all, nullptr);
  EXPECT_THROW(dev->free(static_cast<uint8_t*>(all) + 256), Error);
  int host = 0;
  EXPECT_THROW(dev->free(&host), Error);
}

TEST(HostDevice, GraphReplayEqualsEagerExecution) {
  auto dev = device(uint64_t{16} << 20);
  test::check_graph_replay(*dev);
}

// While a stream captures, its events and syncs are refused by name, and a second capture too.
TEST(HostDevice, CaptureRefusesEventsAndSyncs) {
  auto dev = device(uint64_t{1} << 20);
  const StreamId s = dev->create_stream();
  const EventId e = dev->create_event();
  dev->begin_capture(s);
  EXPECT_THROW(dev->begin_capture(s), Error);
  EXPECT_THROW(dev->record(e, s), Error);
  EXPECT_THROW(dev->wait_event(s, e), Error);
  try {
    dev->sync_stream(s);
    ADD_FAILURE() << "sync_stream while capturing";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("captures a graph"), std::string::npos) << err.what();
  }
  const Device::GraphId empty = dev->end_capture(s);
  dev->launch_graph(empty, s);  // (nothing to run)
  dev->sync_stream(s);
  EXPECT_THROW(dev->end_capture(s), Error);  // not capturing
}

TEST(HostDevice, ErrorsSurfaceOnSyncAndTheStreamGoesOn) {
  auto dev = device();
  const StreamId s = dev->create_stream();
  const EventId before = dev->create_event(), after = dev->create_event();
  bool later_ran = false;
  dev->record(before, s);
  dev->host_callback(s, [] { fail(ErrorKind::kIo, "disk on fire"); });
  dev->record(after, s);
  dev->host_callback(s, [&] { later_ran = true; });
  dev->sync_event(before);  // the failure comes after it: nothing to report
  try {
    dev->sync_event(after);
    ADD_FAILURE() << "error not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("host_callback"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("disk on fire"), std::string::npos) << e.what();
  }
  dev->sync_stream(s);  // reported once
  EXPECT_TRUE(later_ran);
  dev->host_callback(s, [] { throw std::runtime_error("plain"); });
  EXPECT_THROW(dev->sync_stream(s), Error);
  dev->sync_stream(s);
  EXPECT_THROW(dev->sync_stream(99), Error);
  EXPECT_THROW(dev->record(42, s), Error);
}

// ---- ops: bit for bit what moe/fused_moe.cpp computes on the CPU ----

constexpr int64_t kH = 256, kF = 512, kTokens = 3;

ops::Weight random_weight(DType dt, int64_t rows, int64_t cols, std::mt19937& rng,
                          std::vector<std::vector<uint8_t>>& store) {
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> f(static_cast<size_t>(rows * cols));
  for (float& v : f) v = nd(rng);
  const int64_t rb = static_cast<int64_t>(dtype_bytes(dt, cols));
  store.emplace_back(static_cast<size_t>(rb * rows));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(dt, f.data() + r * cols, store.back().data() + r * rb, cols);
  }
  return Tensor::dense(dt, {rows, cols}, store.back().data());
}

// gpt-oss's additions to an expert, on the host: biases and the clamp limit (0: none).
struct HostExtras {
  std::vector<float> gate_bias, up_bias, down_bias;
  float limit = 0.0f;
};

// Its activation written out from the formula (llama.cpp's swiglu_oai): g = min(gate + bg, L),
// u = clamp(up + bu, -L, L), g * sigmoid(1.702 g) * (u + 1).
float oai_activation(float gate, float up, float limit) {
  const float g = std::min(gate, limit), u = std::clamp(up, -limit, limit);
  return g / (1.0f + std::exp(1.702f * -g)) * (u + 1.0f);
}

// One token through one expert, written out from the kernels (the fused MoE's arithmetic), with
// gpt-oss's biases and clamp when `extras` has them.
std::vector<float> expert_direct(const ops::Weight& gw, const ops::Weight& uw,
                                 const ops::Weight& dw, const float* x,
                                 const HostExtras& extras = {}) {
  std::vector<float> g(kF), u(kF), y(kH);
  kern::KMatrix gk, uk, dk;
  if (kern::view_weight(gw, &gk) && kern::view_weight(uw, &uk) && kern::view_weight(dw, &dk)) {
    kern::Activations a, h;
    kern::quantize_activations(kern::act_format(gk.format), 0, x, 1, kH, kH, &a);
    kern::gemm(gk, a, 0, kF, g.data(), kF);
    kern::gemm(uk, a, 0, kF, u.data(), kF);
    for (int64_t i = 0; i < kF; ++i) {
      if (extras.limit > 0.0f) {
        g[i] = oai_activation(g[i] + extras.gate_bias[i], u[i] + extras.up_bias[i], extras.limit);
      } else {
        g[i] = ops::silu(g[i]) * u[i];
      }
    }
    kern::quantize_activations(kern::act_format(dk.format), 0, g.data(), 1, kF, kF, &h);
    kern::gemm(dk, h, 0, kH, y.data(), kH);
    if (!extras.down_bias.empty()) {
      for (int64_t i = 0; i < kH; ++i) y[i] += extras.down_bias[i];
    }
  } else {
    ops::matmul(gw, x, 1, g.data(), nullptr);
    ops::matmul(uw, x, 1, u.data(), nullptr);
    if (extras.limit > 0.0f) {
      for (int64_t i = 0; i < kF; ++i) {
        g[i] = oai_activation(g[i] + extras.gate_bias[i], u[i] + extras.up_bias[i], extras.limit);
      }
    } else {
      ops::swiglu(g.data(), u.data(), kF, g.data());
    }
    ops::matmul(dw, g.data(), 1, y.data(), nullptr);
    if (!extras.down_bias.empty()) {
      for (int64_t i = 0; i < kH; ++i) y[i] += extras.down_bias[i];
    }
  }
  return y;
}

// Copies a host weight into device memory and returns the device view.
ops::Weight to_device(Device& dev, const ops::Weight& w, std::vector<void*>& owned) {
  const uint64_t bytes = static_cast<uint64_t>(w.t.row_bytes() * w.rows());
  void* d = dev.alloc(bytes);
  owned.push_back(d);
  dev.copy_h2d(d, w.t.data, bytes, 0);
  ops::Weight out = w;
  out.t.data = d;
  return out;
}

class HostDeviceFfn : public ::testing::TestWithParam<std::pair<DType, DType>> {};

TEST_P(HostDeviceFfn, MatchesTheCpuBitForBit) {
  std::mt19937 rng(5);
  std::vector<std::vector<uint8_t>> store;
  const ops::Weight gw = random_weight(GetParam().first, kF, kH, rng, store);
  const ops::Weight uw = random_weight(GetParam().first, kF, kH, rng, store);
  const ops::Weight dw = random_weight(GetParam().second, kH, kF, rng, store);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(kTokens * kH), scale{0.5f, -1.25f, 2.0f}, base(kTokens * kH);
  for (float& v : x) v = nd(rng);
  for (float& v : base) v = nd(rng);

  auto dev = device(16 << 20, 2);
  std::vector<void*> owned;
  DeviceFfnWeights w;
  w.gate = to_device(*dev, gw, owned);
  w.up = to_device(*dev, uw, owned);
  w.down = to_device(*dev, dw, owned);
  auto* dx = static_cast<float*>(dev->alloc(x.size() * 4));
  auto* ds = static_cast<float*>(dev->alloc(scale.size() * 4));
  auto* d_plain = static_cast<float*>(dev->alloc(x.size() * 4));
  auto* d_acc = static_cast<float*>(dev->alloc(x.size() * 4));
  auto* d_mm = static_cast<float*>(dev->alloc(kTokens * kF * 4));
  const StreamId s = dev->create_stream();
  const EventId up = dev->create_event();
  dev->copy_h2d(dx, x.data(), x.size() * 4, 0);
  dev->copy_h2d(ds, scale.data(), scale.size() * 4, 0);
  dev->copy_h2d(d_acc, base.data(), base.size() * 4, 0);
  dev->record(up, 0);
  dev->wait_event(s, up);
  dev->ffn(s, w, dx, kTokens, nullptr, d_plain, false);
  dev->ffn(s, w, dx, kTokens, ds, d_acc, true);
  dev->matmul(s, w.gate, dx, kTokens, d_mm);
  dev->add(s, d_plain, d_plain, kTokens * kH);  // doubles it: exact in floating point
  std::vector<float> plain(x.size()), acc(x.size()), mm(kTokens * kF);
  dev->copy_d2h(plain.data(), d_plain, plain.size() * 4, s);
  dev->copy_d2h(acc.data(), d_acc, acc.size() * 4, s);
  dev->copy_d2h(mm.data(), d_mm, mm.size() * 4, s);
  dev->sync_stream(s);

  std::vector<float> mm_ref(kTokens * kF);
  kern::matmul(gw, x.data(), kTokens, mm_ref.data(), nullptr);
  EXPECT_EQ(mm, mm_ref);
  for (int64_t t = 0; t < kTokens; ++t) {
    const std::vector<float> y = expert_direct(gw, uw, dw, x.data() + t * kH);
    for (int64_t i = 0; i < kH; ++i) {
      ASSERT_EQ(plain[t * kH + i], 2.0f * y[i]) << t << "," << i;
      ASSERT_EQ(acc[t * kH + i], base[t * kH + i] + scale[t] * y[i]) << t << "," << i;
    }
  }
  // Host pointers are not device memory (they would crash a CUDA device).
  EXPECT_THROW(dev->ffn(s, w, x.data(), kTokens, nullptr, d_plain, false), Error);

  // gpt-oss's expert: biases (in device memory) and the clamped activation, scaled and
  // accumulated; limit 0.5 so that the clamp really cuts (the products are ~N(0, 0.8)).
  {
    HostExtras hx;
    hx.limit = 0.5f;
    for (auto* b : {&hx.gate_bias, &hx.up_bias}) {
      b->resize(kF);
      for (float& v : *b) v = nd(rng);
    }
    hx.down_bias.resize(kH);
    for (float& v : hx.down_bias) v = nd(rng);
    auto to_dev = [&](const std::vector<float>& v) {
      auto* d = static_cast<float*>(dev->alloc(v.size() * 4));
      owned.push_back(d);
      dev->copy_h2d(d, v.data(), v.size() * 4, 0);
      return d;
    };
    DeviceFfnWeights wx = w;
    wx.extras.gate_bias = to_dev(hx.gate_bias);
    wx.extras.up_bias = to_dev(hx.up_bias);
    wx.extras.down_bias = to_dev(hx.down_bias);
    wx.extras.limit = hx.limit;
    dev->copy_h2d(d_acc, base.data(), base.size() * 4, 0);
    dev->record(up, 0);
    dev->wait_event(s, up);
    dev->ffn(s, wx, dx, kTokens, ds, d_acc, true);
    dev->copy_d2h(acc.data(), d_acc, acc.size() * 4, s);
    dev->sync_stream(s);
    int changed = 0;
    for (int64_t t = 0; t < kTokens; ++t) {
      const std::vector<float> y = expert_direct(gw, uw, dw, x.data() + t * kH, hx);
      const std::vector<float> plain_y = expert_direct(gw, uw, dw, x.data() + t * kH);
      for (int64_t i = 0; i < kH; ++i) {
        ASSERT_EQ(acc[t * kH + i], base[t * kH + i] + scale[t] * y[i]) << t << "," << i;
        changed += y[i] != plain_y[i];
      }
    }
    EXPECT_GT(changed, kTokens * kH / 2);  // the extras changed most outputs
    // A bias given as host memory is refused like any host pointer.
    wx.extras.down_bias = hx.down_bias.data();
    EXPECT_THROW(dev->ffn(s, wx, dx, kTokens, ds, d_acc, true), Error);
  }
  for (void* p : owned) dev->free(p);
}

INSTANTIATE_TEST_SUITE_P(Formats, HostDeviceFfn,
                         ::testing::Values(std::make_pair(DType::kQ4_K, DType::kQ6_K),
                                           std::make_pair(DType::kQ8_0, DType::kQ8_0),
                                           std::make_pair(DType::kF32, DType::kF32),
                                           std::make_pair(DType::kQ4_1, DType::kQ4_1)));

}  // namespace
}  // namespace tandem::rt
