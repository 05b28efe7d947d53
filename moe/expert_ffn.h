// A routed expert's formula on the CPU kernels, in one place for the fused operator's tasks
// (moe/fused_moe.cpp) and the host device's ffn (runtime/host_device.cpp), so that an expert run
// on the emulated accelerator gives the CPU operator's bits: gate and up over the same
// activations, the GLU between them (SiLU(gate) * up, or the model's GLU with its extras:
// gpt-oss's biases, clamp and alpha), down over the GLU's rows in down's activation encoding, then
// down's bias.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/ref_ops.h"

namespace tandem::expert {

// The GLU on columns [c0, c0 + cols) of `rows` rows of stride ld (gate and up at the same
// offsets), in place on gate, row by row: a row's bits do not depend on the rows beside it.
void glu_rows(float* gate, const float* up, int64_t rows, int64_t ld, int64_t c0, int64_t cols,
              const ops::FfnExtras& extras);
// The same over whole rows [rows, ld], SiLU * up as one run (what a whole expert computes).
void glu_block(float* gate, const float* up, int64_t rows, int64_t ld,
               const ops::FfnExtras& extras);
// down's bias on columns [c0, c0 + cols) of `rows` output rows of stride ld (none: nothing).
void add_down_bias(float* y, int64_t rows, int64_t ld, int64_t c0, int64_t cols,
                   const ops::FfnExtras& extras);

// y [rows, w.rows] = the kernels' product of every row of w with a (kern::gemm over all of w's
// rows, on one thread or split over a pool: per-row arithmetic does not depend on the split).
using RowsGemm = std::function<void(const kern::KMatrix& w, const kern::Activations& a, float* y)>;

struct Scratch {
  std::vector<float> g, u;  // [rows, ff]
  kern::Activations h;      // the GLU's rows in down's encoding
};

// One whole expert over the `rows` token rows of x (already in gate's activation encoding):
// y [rows, down.rows].
void whole(const kern::KMatrix& gate, const kern::KMatrix& up, const kern::KMatrix& down,
           const ops::FfnExtras& extras, const kern::Activations& x, Scratch* s, float* y,
           const RowsGemm& gemm);

}  // namespace tandem::expert
