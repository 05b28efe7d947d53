// Graph capture and replay against eager execution, on any Device (the host device's in
// tests/unit/runtime_device_test.cpp, the CUDA device's in tests/gpu/cuda_device_test.cpp): a
// step of an h2d copy, an expert FFN, an add, a host callback and a d2h copy, run eagerly for
// three inputs, then captured once and launched for the same three inputs written into the same
// host memory: each launch's output equals the eager one bit for bit, the host callback runs at
// every launch, and capturing runs nothing.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "runtime/device.h"

namespace tandem::test {

inline void check_graph_replay(rt::Device& dev) {
  constexpr int64_t kH = 64, kF = 96, kT = 3;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  const std::vector<float> g = random(kF * kH), u = random(kF * kH), d = random(kH * kF);
  std::vector<void*> owned;
  auto upload = [&](const std::vector<float>& v) {
    void* p = dev.alloc(v.size() * 4);
    owned.push_back(p);
    dev.copy_h2d(p, v.data(), v.size() * 4, 0);
    return p;
  };
  rt::DeviceFfnWeights w;
  w.gate = ops::Weight(Tensor::dense(DType::kF32, {kF, kH}, upload(g)));
  w.up = ops::Weight(Tensor::dense(DType::kF32, {kF, kH}, upload(u)));
  w.down = ops::Weight(Tensor::dense(DType::kF32, {kH, kF}, upload(d)));
  for (ops::Weight* m : {&w.gate, &w.up, &w.down}) m->t.device = DeviceRef{DeviceKind::kAccel, 0};
  dev.sync_stream(0);
  auto* dx = static_cast<float*>(dev.alloc(kT * kH * 4));
  auto* dy = static_cast<float*>(dev.alloc(kT * kH * 4));
  auto* hx = static_cast<float*>(dev.alloc_host(kT * kH * 4));
  auto* hy = static_cast<float*>(dev.alloc_host(kT * kH * 4));
  const rt::StreamId s = dev.create_stream();
  int calls = 0;
  auto step = [&] {
    dev.copy_h2d(dx, hx, kT * kH * 4, s);
    dev.ffn(s, w, dx, kT, nullptr, dy, false);
    dev.add(s, dx, dy, kT * kH);
    dev.host_callback(s, [&calls] { ++calls; });
    dev.copy_d2h(hy, dy, kT * kH * 4, s);
  };
  std::vector<std::vector<float>> inputs, eager;
  for (int i = 0; i < 3; ++i) inputs.push_back(random(kT * kH));
  for (const std::vector<float>& in : inputs) {
    std::memcpy(hx, in.data(), in.size() * 4);
    step();
    dev.sync_stream(s);
    eager.emplace_back(hy, hy + kT * kH);
  }
  EXPECT_EQ(calls, 3);
  EXPECT_NE(eager[0], eager[1]);  // (the inputs matter)

  std::memset(hy, 0, kT * kH * 4);
  dev.begin_capture(s);
  step();
  const rt::Device::GraphId graph = dev.end_capture(s);
  dev.sync_stream(s);
  EXPECT_EQ(calls, 3);  // captured, not run
  EXPECT_EQ(hy[0], 0.0f);
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::memcpy(hx, inputs[i].data(), inputs[i].size() * 4);
    dev.launch_graph(graph, s);
    dev.sync_stream(s);
    EXPECT_EQ(std::vector<float>(hy, hy + kT * kH), eager[i]) << "launch " << i;
  }
  EXPECT_EQ(calls, 6);
  EXPECT_THROW(dev.launch_graph(graph + 100, s), Error);

  dev.free_host(hx);
  dev.free_host(hy);
  dev.free(dx);
  dev.free(dy);
  for (void* p : owned) dev.free(p);
}

}  // namespace tandem::test
