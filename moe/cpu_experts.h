// The routed experts as the CPU kernels read them (KTransformers §3.2 online quantization): views on the stored weights ("native"); the stored values rearranged at load
// into one huge-page arena ("repack": Q4_K / Q6_K in x16 tiles, ops/cpu/q4k_x16.h, q6k_x16.h, on
// CPUs with AVX-512 VNNI, Q5_0 / Q8_0 in x4 rows, ops/cpu/q0_x4.h, where they have VBMI too, the
// other types copied as stored; the MoE layers' shared experts and every non-expert matrix the
// forward multiplies by too; bit-identical results, no cache: it runs at memory
// speed); or requantized at load into tandem's INT8 / INT4 / BF16 layouts (ops/cpu/packed.h).
// Requantizing a large model takes minutes, so those packed experts are written once to a cache
// file and later loads mmap it (zero copies):
//
//   default file:  <model file or dir>.tandem-<format>[-g<group>].bin next to the model;
//                  $XDG_CACHE_HOME/tandem (else ~/.cache/tandem) when that directory is not
//                  writable; options.cache_dir (or cache_file) overrides.
//   layout:        a 4 KiB header (magic "TDMXPAK1", version, format, group, a fingerprint of the
//                  source: file sizes + mtimes + every expert's shape and dtype), a table of
//                  per-matrix offsets, then each packed matrix 4 KiB-aligned.
// A cache whose magic, version, fingerprint, size or table does not match is rebuilt (one log
// line), never used. docs/cpu-backend.md, "CPU experts".
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/weights.h"
#include "ops/cpu/kernels.h"

namespace tandem {

class ThreadPool;

struct CpuExpertOptions {
  std::string format = "native";    // native | repack | int8 | int4 | bf16
  int group = 128;                  // int8 / int4 quantization group: 32, 64, 128
  std::filesystem::path cache_dir;  // empty: next to the model, else the user cache dir
  bool use_cache = true;            // false: pack in memory, read and write no file
  std::filesystem::path cache_file;  // exact cache file (tandem convert -o); overrides cache_dir
  LoadMode cache_load = LoadMode::kMap;  // map the cache file or copy it into huge-page memory
};

// The routed experts of every MoE layer as kernel matrices: views for native (null data when the
// stored dtype has no fast kernel: the backend then uses the reference path for that expert),
// rearranged in memory for repack, packed (from the on-disk cache when present and valid, else
// packed now and written) for int8/int4/bf16.
// One NUMA part of an expert (KTransformers §3.3 tensor parallelism): rows [f0, f1) of gate and
// up and the same columns of down, copied into memory bound to the part's node. The expert's
// output is the sum of its parts' down outputs.
struct ExpertPart {
  int64_t f0 = 0, f1 = 0;
  kern::KMatrix gate, up, down;
};

struct CpuExperts {
  std::string format;
  std::vector<std::vector<kern::KMatrix>> gate, up, down;  // [layer][expert]; empty for dense layers
  // repack: each MoE layer's shared FFN rearranged like the routed experts ([layer]; a matrix
  // without data where the layer has none); empty for the other formats (views on the stored
  // weights then).
  std::vector<kern::KMatrix> shared_gate, shared_up, shared_down;
  // repack: every other matrix the forward reads through kern::matmul (attention, dense FFN,
  // router, shared experts, lm_head), copied into the arena too (rearranged alike): with these
  // (ModelOptions::views) decode reads no weight from the model file's 4 KiB page-cache pages.
  kern::WeightViews other;
  // NUMA split (split_cpu_experts): part p runs on pool node part_node[p]. parts[layer][expert]
  // is empty where the expert is not split (no fast kernel, or too small to split).
  std::vector<int> part_node;
  std::vector<std::vector<std::vector<ExpertPart>>> parts;
  uint64_t bytes = 0;
  std::filesystem::path cache_path;  // the cache file used or written (empty: none)
  bool from_cache = false;           // mapped from a valid cache (no repacking)
  bool cache_written = false;        // packed now and written to cache_path
};

CpuExperts prepare_cpu_experts(const LoadedModel& model, const CpuExpertOptions& options,
                               ThreadPool* pool);

// NUMA tensor parallelism: splits every expert's intermediate dimension into `nodes.size()` parts
// (as even as the formats' row / column grids allow), part p copied into memory bound to OS node
// os_node[p] (-1: unbound) and run by pool node nodes[p]. One part: nothing changes.
void split_cpu_experts(CpuExperts* experts, const std::vector<int>& nodes,
                       const std::vector<int>& os_node, ThreadPool* pool);

// The routed experts of one MoE layer in one format, from their stored weights: the one place
// expert matrices are made from weights. prepare_cpu_experts makes each layer's through it when it
// does not map a cache file; MoeLayer (moe/moe_layer.h) makes a layer given as raw tensors.
//   native:             views (a KMatrix without data where the dtype has no kernel)
//   repack:             copied into one huge-page arena, Q4_K / Q6_K in x16 tiles and Q5_0 / Q8_0
//                       in x4 rows where the CPU has their kernels, the rest as stored
//   int8 / int4 / bf16: requantized (ops/cpu/packed.h); group: int8 / int4 (32, 64 or 128, and a
//                       divisor of every matrix's columns: Error(kUnsupported) naming it otherwise)
struct LayerExperts {
  std::vector<kern::KMatrix> gate, up, down;  // [expert]
  uint64_t bytes = 0;
};
LayerExperts prepare_layer_experts(const ExpertWeights& experts, const std::string& format,
                                   int group, ThreadPool* pool);

// Where prepare_cpu_experts looks for / writes the cache of `options` (no file is touched).
std::filesystem::path cpu_expert_cache_path(const LoadedModel& model,
                                            const CpuExpertOptions& options);

}  // namespace tandem
