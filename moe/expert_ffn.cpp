#include "moe/expert_ffn.h"

namespace tandem::expert {

void glu_rows(float* gate, const float* up, int64_t rows, int64_t ld, int64_t c0, int64_t cols,
              const ops::FfnExtras& extras) {
  for (int64_t j = 0; j < rows; ++j) {
    float* g = gate + j * ld;
    const float* u = up + j * ld;
    if (extras.any()) {
      ops::glu_with_extras(g, u, cols, c0, extras);
    } else {
      kern::swiglu(g, u, cols, g);
    }
  }
}

void glu_block(float* gate, const float* up, int64_t rows, int64_t ld,
               const ops::FfnExtras& extras) {
  if (extras.any()) {
    glu_rows(gate, up, rows, ld, 0, ld, extras);
  } else {
    kern::swiglu(gate, up, rows * ld, gate);
  }
}

void add_down_bias(float* y, int64_t rows, int64_t ld, int64_t c0, int64_t cols,
                   const ops::FfnExtras& extras) {
  if (extras.down_bias == nullptr) return;
  for (int64_t j = 0; j < rows; ++j) ops::add_down_bias(y + j * ld + c0, cols, c0, extras);
}

void whole(const kern::KMatrix& gate, const kern::KMatrix& up, const kern::KMatrix& down,
           const ops::FfnExtras& extras, const kern::Activations& x, Scratch* s, float* y,
           const RowsGemm& gemm) {
  const int64_t n = x.tokens, ff = gate.rows, h = down.rows;
  if (s->g.size() < static_cast<size_t>(n * ff)) s->g.resize(static_cast<size_t>(n * ff));
  if (s->u.size() < static_cast<size_t>(n * ff)) s->u.resize(static_cast<size_t>(n * ff));
  gemm(gate, x, s->g.data());
  gemm(up, x, s->u.data());
  glu_block(s->g.data(), s->u.data(), n, ff, extras);
  kern::quantize_activations(kern::act_format(down.format), down.group, s->g.data(), n, ff, ff,
                             &s->h);
  gemm(down, s->h, y);
  add_down_bias(y, n, h, 0, h, extras);
}

}  // namespace tandem::expert
