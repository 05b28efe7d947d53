// The roofline kernels do real arithmetic (read checksums equal an independent sum, compute
// chains end at the value the formula predicts), and a small measurement gives positive, finite,
// sensibly ordered numbers. Nothing here asserts a speed.
#include "ops/cpu/roofline.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>

#include "core/error.h"
#include "core/memory.h"
#include "ops/cpu/roofline_kernels.h"

namespace tandem::cpu {
namespace {

TEST(RooflineKernels, ReadChecksumsEqualAnIndependentSum) {
  const std::vector<ReadKernel> kernels = read_kernels();
  ASSERT_FALSE(kernels.empty());
  EXPECT_STREQ(kernels.back().name, "scalar");
  if (best_isa() >= Isa::kAvx512) {
    EXPECT_STREQ(kernels.front().name, "avx512");
  }
  constexpr size_t kMax = 64 * 1024 + 4096;
  AlignedBuffer buf(kMax, AllocOptions{64});
  uint64_t* words = buf.as<uint64_t>();
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < kMax / 8; ++i) words[i] = rng();
  // Sizes around every block boundary of every variant (512, 256, 64 bytes and 8-byte tails).
  for (size_t bytes : {0ul, 8ul, 56ul, 64ul, 72ul, 248ul, 256ul, 264ul, 504ul, 512ul, 520ul, 1000ul,
                       4096ul, 4104ul, 65536ul + 448ul, kMax}) {
    uint64_t expected = 0;
    for (size_t i = 0; i < bytes / 8; ++i) expected += words[i];  // wraps mod 2^64 like the kernels
    for (const ReadKernel& k : kernels) {
      EXPECT_EQ(k.fn(words, bytes), expected) << k.name << " over " << bytes << " bytes";
    }
  }
}

TEST(RooflineKernels, ComputeChainsEndWhereTheFormulaSays) {
  const std::vector<ComputeKernel> kernels = compute_kernels();
  std::set<ComputeKind> kinds;
  for (const ComputeKernel& k : kernels) {
    kinds.insert(k.kind);
    for (uint64_t n : {0ull, 1ull, 7ull, 1000ull}) {
      // Every lane: start + step * n; exact in float/int32 at these sizes.
      const double expected = k.lanes * (k.start + k.step * static_cast<double>(n));
      EXPECT_EQ(k.fn(n), expected) << k.name << " after " << n << " iterations";
    }
    // Operations per iteration: lanes x 2 per multiply-add x the products per lane.
    const double products = k.kind == ComputeKind::kFp32Fma    ? 1
                            : k.kind == ComputeKind::kBf16Dot  ? 2
                            : k.kind == ComputeKind::kInt8Dot  ? 4
                            : k.kind == ComputeKind::kAmxInt8 ? 64
                                                               : 32;  // kAmxBf16
    EXPECT_EQ(k.ops_per_iteration, k.lanes * 2 * products) << k.name;
  }
  EXPECT_TRUE(kinds.count(ComputeKind::kFp32Fma));
  EXPECT_TRUE(kinds.count(ComputeKind::kInt8Dot));
  // What this CPU should pick, from its features.
  const CpuFeatures& f = cpu_features();
  ASSERT_NE(best_compute_kernel(ComputeKind::kFp32Fma), nullptr);
  if (best_isa() >= Isa::kAvx512) {
    EXPECT_STREQ(best_compute_kernel(ComputeKind::kFp32Fma)->name, "avx512_fma");
  }
  const ComputeKernel* bf16 = best_compute_kernel(ComputeKind::kBf16Dot);
  EXPECT_EQ(bf16 != nullptr, best_isa() >= Isa::kAvx512Bf16 && f.avx512_bf16);
  const ComputeKernel* int8 = best_compute_kernel(ComputeKind::kInt8Dot);
  ASSERT_NE(int8, nullptr);
  if (best_isa() >= Isa::kAvx512Vnni) {
    EXPECT_TRUE(f.avx512_vnni);
    EXPECT_STREQ(int8->name, "avx512_vnni");
  } else if (best_isa() >= Isa::kAvx2 && f.avx_vnni) {
    EXPECT_STREQ(int8->name, "avx_vnni");
  }
  // The AMX peaks exactly where AMX is usable (run, and checked above, only there).
  EXPECT_EQ(best_compute_kernel(ComputeKind::kAmxInt8) != nullptr,
            best_isa() >= Isa::kAmx && f.amx_tile && f.amx_int8);
  EXPECT_EQ(best_compute_kernel(ComputeKind::kAmxBf16) != nullptr,
            best_isa() >= Isa::kAmx && f.amx_tile && f.amx_bf16);
}

TEST(Roofline, SmallMeasurementIsPositiveFiniteAndOrdered) {
  // One thread: on a busy 2-core machine (parallel builds) a thread that waits at the start
  // barrier for a descheduled peer would distort the numbers; alone, best-of-6 is robust.
  ThreadingContext ctx(detect_topology(), ThreadingOptions{0, true, 50});
  RooflineOptions opt;
  opt.threads = 1;
  opt.dram_bytes = size_t{64} << 20;
  opt.seconds = 0.001;  // short runs, many of them: some escape preemption on a busy machine
  opt.repetitions = 6;
  opt.thread_sweep = false;
  const RooflineResult r = measure_roofline(ctx, opt);
  EXPECT_EQ(r.threads, 1);
  EXPECT_EQ(r.isa, isa_name(best_isa()));
  EXPECT_EQ(r.dram_buffer_bytes, size_t{64} << 20);
  for (double v : {r.dram_read_gbs, r.l2_read_gbs, r.fp32_gflops, r.int8_gops}) {
    EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
  }
  if (ctx.topology().l3_bytes > 0) {
    EXPECT_GT(r.l3_read_gbs, 0);
  }
  // L2-resident data streams faster than a buffer larger than the whole L3.
  EXPECT_GE(r.l2_read_gbs, r.dram_read_gbs);
  EXPECT_FALSE(r.dram_kernel.empty());
  EXPECT_FALSE(r.l2_kernel.empty());
  EXPECT_EQ(r.dram_variants.size(), read_kernels().size() - 1);  // all but scalar
  ASSERT_EQ(r.dram_sweep.size(), 1u);
  EXPECT_EQ(r.dram_sweep[0].value, r.dram_read_gbs);
  ASSERT_EQ(r.fp32_sweep.size(), 1u);
  EXPECT_EQ(r.fp32_sweep[0].threads, 1);
  EXPECT_EQ(r.fp32_sweep[0].value, r.fp32_gflops);
  EXPECT_EQ(r.bf16_gflops > 0, best_compute_kernel(ComputeKind::kBf16Dot) != nullptr);
}

TEST(Roofline, DramReadProbeMeasuresAgainOnItsBuffer) {
  ThreadingContext ctx(detect_topology(), ThreadingOptions{0, true, 50});
  RooflineOptions opt;
  opt.threads = 1;
  opt.dram_bytes = size_t{16} << 20;
  opt.seconds = 0.001;
  opt.repetitions = 2;
  DramReadProbe probe(ctx, opt);
  EXPECT_EQ(probe.threads(), 1);
  EXPECT_EQ(probe.buffer_bytes(), size_t{16} << 20);
  std::vector<RooflinePoint> variants;
  const double first = probe.measure(&variants);
  ASSERT_EQ(variants.size(), read_kernels().size() - 1);  // all but scalar
  double best = 0;
  std::string best_name;
  for (const RooflinePoint& v : variants) {
    EXPECT_TRUE(std::isfinite(v.value) && v.value > 0) << v.kernel;
    EXPECT_EQ(v.threads, 1);
    if (v.value > best) {
      best = v.value;
      best_name = v.kernel;
    }
  }
  EXPECT_EQ(first, best);
  EXPECT_EQ(probe.best_kernel(), best_name);
  const double again = probe.measure();  // the same buffers, no reallocation
  EXPECT_TRUE(std::isfinite(again) && again > 0);
  EXPECT_GT(probe.measure_at(1), 0);
  opt.threads = 1000;
  EXPECT_THROW(DramReadProbe(ctx, opt), Error);
}

TEST(Roofline, TheCallingThreadMeasuresToo) {
  // The caller is one of ctx's threads (ThreadingOptions::n_threads): a workerless pool measures
  // on the caller alone, and n threads = n - 1 workers + the caller, all of them reading.
  for (int threads : {1, 2}) {
    ThreadingContext ctx(synthetic_topology(1, 2), ThreadingOptions{threads, false, 20});
    ASSERT_EQ(ctx.pool().size(), threads - 1);
    RooflineOptions opt;
    opt.dram_bytes = size_t{4} << 20;
    opt.seconds = 0.001;
    opt.repetitions = 1;
    DramReadProbe probe(ctx, opt);
    EXPECT_EQ(probe.threads(), threads);  // the default: all of ctx's threads
    const double gbs = probe.measure();
    EXPECT_TRUE(std::isfinite(gbs) && gbs > 0) << threads;
    EXPECT_GT(probe.measure_at(threads), 0);
    opt.threads = threads + 1;
    EXPECT_THROW(DramReadProbe(ctx, opt), Error);
  }
}

TEST(Roofline, OptionsAreValidated) {
  ThreadingContext ctx(synthetic_topology(1, 1), ThreadingOptions{1, false, 20});
  RooflineOptions opt;
  opt.threads = 2;
  EXPECT_THROW(measure_roofline(ctx, opt), Error);
  opt.threads = 1;
  opt.seconds = 0;
  EXPECT_THROW(measure_roofline(ctx, opt), Error);
  opt.seconds = NAN;
  EXPECT_THROW(measure_roofline(ctx, opt), Error);
  opt.seconds = 0.01;
  opt.dram_bytes = 1000;
  try {
    measure_roofline(ctx, opt);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("1000"), std::string::npos);
  }
}

TEST(Roofline, SweepCounts) {
  EXPECT_EQ(sweep_thread_counts(1), std::vector<int>{1});
  EXPECT_EQ(sweep_thread_counts(2), (std::vector<int>{1, 2}));
  EXPECT_EQ(sweep_thread_counts(6), (std::vector<int>{1, 2, 4, 6}));
  EXPECT_EQ(sweep_thread_counts(8), (std::vector<int>{1, 2, 4, 8}));
}

TEST(Roofline, JsonRoundTripAndErrors) {
  RooflineResult r;
  r.threads = 2;
  r.isa = "avx512_bf16";
  r.dram_read_gbs = 34.5;
  r.dram_kernel = "avx512_prefetch";
  r.l2_kernel = "avx512";
  r.int8_gops = 1800.25;
  r.int8_kernel = "avx512_vnni";
  r.amx_int8_gops = 30000.5;
  r.amx_int8_kernel = "amx_int8";
  r.amx_bf16_sweep = {{16, 15000.25, "amx_bf16"}};
  r.huge_pages = true;
  r.dram_buffer_bytes = size_t{1} << 30;
  r.dram_sweep = {{1, 20.0, "avx512"}, {2, 34.5, "avx512"}};
  const RooflineResult back = roofline_from_json(roofline_to_json(r));
  EXPECT_EQ(back.threads, 2);
  EXPECT_EQ(back.isa, "avx512_bf16");
  EXPECT_EQ(back.dram_read_gbs, 34.5);
  EXPECT_EQ(back.dram_kernel, "avx512_prefetch");
  EXPECT_EQ(back.l2_kernel, "avx512");
  EXPECT_EQ(back.int8_gops, 1800.25);
  EXPECT_TRUE(back.huge_pages);
  EXPECT_EQ(back.dram_buffer_bytes, size_t{1} << 30);
  ASSERT_EQ(back.dram_sweep.size(), 2u);
  EXPECT_EQ(back.dram_sweep[1].value, 34.5);
  EXPECT_EQ(back.dram_sweep[0].threads, 1);
  EXPECT_EQ(back.amx_int8_gops, 30000.5);
  EXPECT_EQ(back.amx_int8_kernel, "amx_int8");
  EXPECT_EQ(back.amx_bf16_gflops, 0);
  ASSERT_EQ(back.amx_bf16_sweep.size(), 1u);
  EXPECT_EQ(back.amx_bf16_sweep[0].value, 15000.25);
  // A file from before the AMX lines reads as a CPU without AMX.
  std::string old = roofline_to_json(r, -1);
  for (const char* key : {"\"amx_int8_gops\":30000.5,", "\"amx_int8_kernel\":\"amx_int8\",",
                          "\"amx_bf16_gflops\":0.0,", "\"amx_bf16_kernel\":\"\","}) {
    const size_t at = old.find(key);
    ASSERT_NE(at, std::string::npos) << key << " in " << old;
    old.erase(at, std::string(key).size());
  }
  const RooflineResult before_amx = roofline_from_json(old);
  EXPECT_EQ(before_amx.amx_int8_gops, 0);
  EXPECT_TRUE(before_amx.amx_int8_kernel.empty());
  EXPECT_EQ(before_amx.int8_gops, 1800.25);

  try {
    roofline_from_json("{\"threads\": 2}");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("numa_nodes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(roofline_from_json("not json"), Error);
  EXPECT_THROW(roofline_from_json("[1, 2]"), Error);
  std::string wrong = roofline_to_json(r);
  wrong.replace(wrong.find("\"isa\": \"avx512_bf16\""), 20, "\"isa\": 5");
  EXPECT_THROW(roofline_from_json(wrong), Error);
}

}  // namespace
}  // namespace tandem::cpu
