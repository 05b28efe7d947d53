#include "runtime/trace_synth.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"

namespace tandem::rt {
namespace {

// A fixed random permutation of 0..n-1 per (seed, layer, purpose).
std::vector<int> permutation(uint64_t seed, int layer, int purpose, int n) {
  std::vector<int> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + uint64_t(layer) * 1315423911ull +
                      uint64_t(purpose));
  std::shuffle(p.begin(), p.end(), rng);
  return p;
}

void check(const SynthTraceOptions& o) {
  auto bad = [](const char* name, double v) {
    fail(ErrorKind::kInvalidArgument, "synthetic trace: {} = {} is out of range", name, v);
  };
  if (o.n_layers < 1 || o.n_layers > 4096) bad("layers", o.n_layers);
  if (o.n_experts < 1 || o.n_experts > 65536) bad("experts", o.n_experts);
  if (o.top_k < 1 || o.top_k > o.n_experts) bad("top-k", o.top_k);
  if (!(o.skew >= 0 && o.skew <= 10)) bad("skew", o.skew);
  if (!(o.locality >= 0 && o.locality <= 1)) bad("locality", o.locality);
  if (!(o.correlation >= 0 && o.correlation <= 1)) bad("correlation", o.correlation);
  if (o.prefill_batches < 1 || o.prefill_batches > 1000000) bad("prompts", o.prefill_batches);
  if (o.prefill_tokens < 1 || o.prefill_tokens > 1000000) bad("prefill-tokens", o.prefill_tokens);
  if (o.decode_steps < 0 || o.decode_steps > 1000000) bad("decode-steps", o.decode_steps);
  if (!(o.gate_noise >= 0) || !(o.residual_noise >= 0))
    bad("noise", std::min(o.gate_noise, o.residual_noise));
  const double records = double(o.prefill_batches) * (o.prefill_tokens + o.decode_steps);
  if (records * o.n_layers * (o.n_experts * 3.0 + o.top_k * 2.0) * 4 > 8e9) {
    bad("records x layers x experts (more than 8 GB)", records);
  }
}

}  // namespace

int synth_related_expert(const SynthTraceOptions& o, int layer, int expert) {
  return permutation(o.seed, layer + 1, 1, o.n_experts)[static_cast<size_t>(expert)];
}

Trace synth_trace(const SynthTraceOptions& o) {
  check(o);
  const int L = o.n_layers, E = o.n_experts, K = o.top_k;
  Trace t;
  t.model = o.model;
  t.n_layers = L;
  t.n_experts = E;
  t.top_k = K;
  t.has_scores = o.scores;
  t.has_gate_pred = o.predictions;
  t.has_residual_pred = o.predictions;
  std::vector<std::vector<int>> popular(L), related(L);
  for (int l = 0; l < L; ++l) {
    popular[l] = permutation(o.seed, l, 0, E);
    related[l] = permutation(o.seed, l, 1, E);  // related[l][e]: layer l's partner of e at l - 1
  }
  std::vector<double> cdf(static_cast<size_t>(E));
  double acc = 0;
  for (int i = 0; i < E; ++i) cdf[i] = acc += std::pow(double(i + 1), -o.skew);
  for (double& c : cdf) c /= acc;
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto zipf = [&](int l) {
    const double u = uni(rng);
    const auto it = std::lower_bound(cdf.begin(), cdf.end(), u);
    return popular[l][std::min<size_t>(size_t(it - cdf.begin()), size_t(E - 1))];
  };
  std::vector<int32_t> prev(static_cast<size_t>(L * K)), cur(static_cast<size_t>(L * K));
  std::vector<float> sc(static_cast<size_t>(L * E));
  std::vector<uint8_t> taken(static_cast<size_t>(E));
  int32_t batch = 0;
  for (int p = 0; p < o.prefill_batches; ++p) {
    const int n_tok = o.prefill_tokens + o.decode_steps;
    for (int tok = 0; tok < n_tok; ++tok) {
      const bool decode = tok >= o.prefill_tokens;
      if (decode || tok == 0) ++batch;
      const int64_t r =
          t.add_record(tok, decode ? TracePhase::kDecode : TracePhase::kPrefill, batch);
      for (int l = 0; l < L; ++l) {
        std::fill(taken.begin(), taken.end(), 0);
        int32_t* ids = cur.data() + l * K;
        for (int j = 0; j < K; ++j) {
          int e = -1;
          if (tok > 0 && uni(rng) < o.locality) e = prev[l * K + j];
          if ((e < 0 || taken[e]) && l > 0 && uni(rng) < o.correlation)
            e = related[l][cur[(l - 1) * K + j]];
          for (int tries = 0; (e < 0 || taken[e]) && tries < 64; ++tries) e = zipf(l);
          if (e < 0 || taken[e]) e = int(std::find(taken.begin(), taken.end(), 0) - taken.begin());
          taken[e] = 1;
          ids[j] = e;
        }
        // Routing weights: a random share of the mass, descending over the slots; the other
        // experts split the rest and stay below the smallest selected weight.
        float* s = sc.data() + l * E;
        std::vector<double> w(static_cast<size_t>(K));
        double wsum = 0;
        for (double& x : w) wsum += x = std::exp(0.5 * normal(rng));
        std::sort(w.begin(), w.end(), std::greater<>());
        const double mass = 0.5 + 0.4 * uni(rng);
        double rest_sum = 0;
        std::vector<double> rest(static_cast<size_t>(E), 0.0);
        for (int e = 0; e < E; ++e) {
          if (!taken[e]) rest_sum += rest[e] = uni(rng) + 1e-3;
        }
        const double wmin = w[K - 1] / wsum * mass;
        for (int e = 0; e < E; ++e) {
          s[e] = taken[e] ? 0.f : float(std::min(rest[e] / rest_sum * (1 - mass), 0.99 * wmin));
        }
        for (int j = 0; j < K; ++j) {
          s[ids[j]] = float(w[j] / wsum * mass);
          t.weights_at(r, l)[j] = s[ids[j]];
          t.ids_at(r, l)[j] = ids[j];
        }
      }
      if (o.scores) std::copy(sc.begin(), sc.end(), t.scores.begin() + r * L * E);
      if (o.predictions) {
        for (int l = 0; l + 1 < L; ++l) {
          float* g = t.gate_pred.data() + (r * L + l) * E;
          float* res = t.residual_pred.data() + (r * L + l) * E;
          const float* next = sc.data() + (l + 1) * E;
          for (int e = 0; e < E; ++e) {
            const double z = normal(rng);
            g[e] = float(next[e] * std::exp(o.gate_noise * z));
            res[e] = float(next[e] * std::exp(o.residual_noise * z));
          }
        }
      }
      std::swap(prev, cur);
    }
  }
  return t;
}

}  // namespace tandem::rt
