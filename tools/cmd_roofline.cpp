// `tandem roofline`: measures this machine's DRAM / L3 / L2 read bandwidth and peak fp32, bf16
// and int8 throughput (ops/cpu/roofline.h), prints a table or JSON. Benchmarks quote their
// results as fractions of these numbers.
#include <fmt/format.h>

#include <memory>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu/roofline.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

struct RooflineArgs {
  bool json = false;
  int threads = 0;
  double size_mb = 1024;
  double seconds = 0.25;
  int repetitions = 3;
  bool no_huge_pages = false;
  bool no_sweep = false;
};

std::string point_list(const std::vector<cpu::RooflinePoint>& points) {
  std::string s;
  for (const cpu::RooflinePoint& p : points) {
    s += fmt::format("{}{}t {:.1f}", s.empty() ? "" : ", ", p.threads, p.value);
  }
  return s;
}

// One row: what, value and unit, kernel, detail (the sweep or the buffer size).
void row(const char* what, double value, const char* unit, const std::string& kernel,
         const std::string& detail) {
  fmt::print("{:<10} {:>8.1f} {:<7}  {:<16} {}\n", what, value, unit, kernel, detail);
}

void print_table(const cpu::RooflineResult& r) {
  fmt::print("roofline: {} threads, kernel ISA {}, {} NUMA node(s)\n", r.threads, r.isa,
             r.numa_nodes);
  fmt::print("{:<10} {:>16}  {:<16} {}\n", "", "best", "kernel", "by threads / buffer");
  row("DRAM read", r.dram_read_gbs, "GB/s", r.dram_kernel, point_list(r.dram_sweep));
  if (r.l3_read_gbs > 0) {
    row("L3 read", r.l3_read_gbs, "GB/s", r.l3_kernel,
        format_binary_bytes(r.l3_bytes_per_thread) + " per thread");
  }
  if (r.l2_read_gbs > 0) {
    row("L2 read", r.l2_read_gbs, "GB/s", r.l2_kernel,
        format_binary_bytes(r.l2_bytes_per_thread) + " per thread");
  }
  auto compute = [](const char* what, const char* unit, double value, const std::string& kernel,
                    const std::vector<cpu::RooflinePoint>& sweep, const char* without = nullptr) {
    if (kernel.empty()) {
      fmt::print("{:<10} {:>16}  ({})\n", what, "-",
                 without != nullptr ? without : "no kernel on this CPU");
    } else {
      row(what, value, unit, kernel, point_list(sweep));
    }
  };
  compute("fp32 FMA", "GFLOP/s", r.fp32_gflops, r.fp32_kernel, r.fp32_sweep);
  compute("bf16 dot", "GFLOP/s", r.bf16_gflops, r.bf16_kernel, r.bf16_sweep,
          "no AVX-512 BF16: BF16 and FP8 weights are widened to F32, the fp32 FMA peak applies");
  compute("int8 dot", "GOP/s", r.int8_gops, r.int8_kernel, r.int8_sweep);
  compute("AMX int8", "GOP/s", r.amx_int8_gops, r.amx_int8_kernel, r.amx_int8_sweep);
  compute("AMX bf16", "GFLOP/s", r.amx_bf16_gflops, r.amx_bf16_kernel, r.amx_bf16_sweep);
  std::string variants;
  for (const cpu::RooflinePoint& p : r.dram_variants) {
    variants += fmt::format("{}{} {:.1f}", variants.empty() ? "" : ", ", p.kernel, p.value);
  }
  fmt::print("DRAM read variants (GB/s): {}\n", variants);
  fmt::print("DRAM buffer {}, huge pages {} ({} backed)\n",
             format_binary_bytes(r.dram_buffer_bytes), r.huge_pages ? "on" : "off",
             format_binary_bytes(r.huge_page_backed_bytes));
}

void run_roofline(const RooflineArgs& args) {
  if (args.threads < 0) {
    fail(ErrorKind::kInvalidArgument, "--threads {} must be positive (0: all cores)", args.threads);
  }
  if (!(args.size_mb >= 1) || args.size_mb > 1024.0 * 1024.0) {
    fail(ErrorKind::kInvalidArgument, "--size-mb {} is not in 1..1048576", args.size_mb);
  }
  ThreadingContext ctx(ThreadingOptions{args.threads, true, 50});
  cpu::RooflineOptions opt;
  opt.threads = ctx.n_threads();
  opt.dram_bytes = static_cast<size_t>(args.size_mb * 1024 * 1024);
  opt.seconds = args.seconds;
  opt.repetitions = args.repetitions;
  opt.huge_pages = !args.no_huge_pages;
  opt.thread_sweep = !args.no_sweep;
  const uint64_t available = ctx.topology().available_memory_bytes;
  if (available > 0 && opt.dram_bytes > available / 2) {
    fail(ErrorKind::kResource,
         "--size-mb {}: the buffer would take more than half of the {} available", args.size_mb,
         format_binary_bytes(available));
  }
  const cpu::RooflineResult r = cpu::measure_roofline(ctx, opt);
  if (args.json) {
    fmt::print("{}\n", cpu::roofline_to_json(r));
  } else {
    print_table(r);
  }
}

void add_roofline(CLI::App& app) {
  auto args = std::make_shared<RooflineArgs>();
  app.add_flag("--json", args->json, "print JSON instead of a table");
  add_threads_option(app, &args->threads);
  app.add_option("--size-mb", args->size_mb, "DRAM buffer in MiB, all NUMA nodes together")
      ->capture_default_str();
  app.add_option("--seconds", args->seconds, "minimum duration of one timed repetition")
      ->capture_default_str();
  app.add_option("--repetitions", args->repetitions, "timed repetitions, the best is reported")
      ->capture_default_str();
  app.add_flag("--no-huge-pages", args->no_huge_pages, "plain 4 KiB pages for the DRAM buffer");
  app.add_flag("--no-sweep", args->no_sweep, "measure only at the full thread count");
  app.callback([args] { run_roofline(*args); });
}

Registrar reg("roofline", "Measure DRAM/cache bandwidth and peak fp32/bf16/int8 throughput",
              add_roofline);

}  // namespace
}  // namespace tandem::tools
