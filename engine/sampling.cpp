#include "engine/sampling.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem {

namespace {

[[noreturn]] void non_finite_logit(const float* logits, int64_t n_vocab) {
  int64_t i = 0;
  while (i < n_vocab && !(std::isnan(logits[i]) || logits[i] == INFINITY)) ++i;
  fail(ErrorKind::kFormat,
       "the model computed a non-finite logit ({} for token {}): corrupt weights, or values "
       "overflowing in its forward",
       i < n_vocab ? logits[i] : 0.0f, i);
}

}  // namespace

int32_t argmax_token(const float* logits, int64_t n_vocab) {
  // One pass finds the largest logit and notices NaN / +inf, which max_element would silently
  // turn into token 0.
  int64_t best = 0;
  bool bad = false;
  for (int64_t i = 0; i < n_vocab; ++i) {
    const float x = logits[i];
    bad |= !(x < INFINITY);  // NaN or +inf
    if (x > logits[best]) best = i;
  }
  if (bad) non_finite_logit(logits, n_vocab);
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  // Written so that NaN fails each test.
  if (!(params.temperature >= 0.0f && std::isfinite(params.temperature))) {
    fail(ErrorKind::kInvalidArgument, "--temp must be a finite number >= 0, got {}",
         params.temperature);
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    fail(ErrorKind::kInvalidArgument, "--top-p must be in (0, 1], got {}", params.top_p);
  }
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) {
    fail(ErrorKind::kInvalidArgument, "--min-p must be in [0, 1], got {}", params.min_p);
  }
  if (params.top_k < 0)
    fail(ErrorKind::kInvalidArgument, "--top-k must be >= 0, got {}", params.top_k);
}

int32_t Sampler::sample(const float* logits, int64_t n_vocab) {
  if (params_.temperature <= 0.0f) return argmax_token(logits, n_vocab);
  cand_.resize(static_cast<size_t>(n_vocab));
  bool bad = false;  // NaN breaks the sort's ordering: refused before it
  for (int64_t i = 0; i < n_vocab; ++i) {
    cand_[i] = {logits[i], static_cast<int32_t>(i)};
    bad |= !(logits[i] < INFINITY);
  }
  if (bad) non_finite_logit(logits, n_vocab);
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = cand_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    n = static_cast<size_t>(params_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + n, cand_.end(), by_logit);
    cand_.resize(n);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Probabilities at the sampling temperature, largest first.
  const float mx = cand_[0].first;
  double sum = 0;
  for (auto& c : cand_) {
    c.first = std::exp((c.first - mx) / params_.temperature);
    sum += c.first;
  }
  for (auto& c : cand_) c.first = static_cast<float>(c.first / sum);
  double cum = 0;
  size_t keep = 0;
  const float floor_p = params_.min_p * cand_[0].first;
  while (keep < cand_.size()) {
    if (keep > 0 && (cum >= params_.top_p || cand_[keep].first < floor_p)) break;
    cum += cand_[keep].first;
    ++keep;
  }
  std::uniform_real_distribution<double> u(0.0, cum);
  const double r = u(rng_);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += cand_[i].first;
    if (r < acc) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

}  // namespace tandem
