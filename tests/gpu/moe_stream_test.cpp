// MoeLayer's submit and sync as host functions on a CUDA stream (moe/moe_stream.h): the layer
// runs when the stream reaches the submit -- after a copy enqueued before it filled the hidden
// states -- and the stream does not pass the sync until the output is written (a copy enqueued
// after the sync reads it); the result equals forward() bit for bit. Two layers in flight on one
// stream; an error inside the submit's host function is raised by the next sync().
#include <gtest/gtest.h>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "moe/moe_layer.h"
#include "moe/moe_stream.h"
#endif
#include "tests/gpu/gpu_gate.h"

#ifdef TANDEM_HAVE_CUDA
namespace tandem {
namespace {

std::string golden(const std::string& name) {
  return std::string(TANDEM_TEST_DATA_DIR) + "/golden/" + name;
}

struct Pinned {
  explicit Pinned(size_t bytes) { EXPECT_EQ(cudaMallocHost(&p, bytes), cudaSuccess); }
  ~Pinned() { cudaFreeHost(p); }
  void* p = nullptr;
};

TEST(MoeStream, SubmitAndSyncRunInStreamOrder) {
  auto ctx = make_moe_context(2);
  MoeLayerOptions o;
  o.method = "gguf";
  MoeLayer a(ctx, o, golden("qwen3moe-q8_0.gguf"), 0), b(ctx, o, golden("qwen3moe-q8_0.gguf"), 1);
  o = a.options();
  const int64_t T = 5, H = o.hidden_size, K = o.num_experts_per_tok;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(T * H)), w(static_cast<size_t>(T * K), 0.25f);
  for (float& v : x) v = nd(rng);
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 5 + i / 2) % 8);
  std::vector<float> want_a(x.size()), want_b(x.size());
  a.forward(x.data(), T, ids.data(), w.data(), K, want_a.data());
  b.forward(x.data(), T, ids.data(), w.data(), K, want_b.data());

  // The hidden states reach the pinned buffer by a device round trip enqueued before the submit.
  const size_t bytes = x.size() * sizeof(float);
  Pinned hidden(bytes), out_a(bytes), out_b(bytes), back_a(bytes), back_b(bytes);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), bytes), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::memset(hidden.p, 0, bytes);
  ASSERT_EQ(cudaMemcpyAsync(dev, x.data(), bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(hidden.p, dev, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
  const auto stream = reinterpret_cast<uintptr_t>(s);
  enqueue_submit(stream, &a, static_cast<float*>(hidden.p), T, ids.data(), w.data(), K,
                 static_cast<float*>(out_a.p));
  enqueue_submit(stream, &b, static_cast<float*>(hidden.p), T, ids.data(), w.data(), K,
                 static_cast<float*>(out_b.p));
  enqueue_sync(stream, &a);
  enqueue_sync(stream, &b);
  // Enqueued after the syncs: they copy the finished outputs.
  ASSERT_EQ(cudaMemcpyAsync(dev, out_a.p, bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back_a.p, dev, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev, out_b.p, bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back_b.p, dev, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  a.sync();  // nothing left in flight; no kept error
  b.sync();
  EXPECT_EQ(std::memcmp(back_a.p, want_a.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(back_b.p, want_b.data(), bytes), 0);

  // A submit that fails in its host function: the next sync() raises it.
  std::vector<int32_t> bad = ids;
  bad[0] = 99;
  enqueue_submit(stream, &a, static_cast<float*>(hidden.p), T, bad.data(), w.data(), K,
                 static_cast<float*>(out_a.p));
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_THROW(a.sync(), Error);
  a.forward(x.data(), T, ids.data(), w.data(), K, want_a.data());  // the layer still works
  cudaStreamDestroy(s);
  cudaFree(dev);
}

}  // namespace
}  // namespace tandem
#endif

int main(int argc, char** argv) {
  return tandem::test::gpu_test_main(argc, argv);
}
