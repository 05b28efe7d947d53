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

void check_sampling_params(const SamplingParams& p, int64_t n_vocab) {
  // (Written so that NaN fails every check.)
  if (!(p.temperature >= 0.0f && std::isfinite(p.temperature))) {
    fail(ErrorKind::kInvalidArgument, "--temp must be a finite number >= 0, got {}",
         p.temperature);
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    fail(ErrorKind::kInvalidArgument, "--top-p must be in (0, 1], got {}", p.top_p);
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    fail(ErrorKind::kInvalidArgument, "--min-p must be in [0, 1], got {}", p.min_p);
  }
  if (p.top_k < 0) fail(ErrorKind::kInvalidArgument, "--top-k must be >= 0, got {}", p.top_k);
  if (!(p.repeat_penalty > 0.0f && std::isfinite(p.repeat_penalty))) {
    fail(ErrorKind::kInvalidArgument, "--repeat-penalty must be a finite number > 0, got {}",
         p.repeat_penalty);
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    fail(ErrorKind::kInvalidArgument, "--presence-penalty must be in [-2, 2], got {}",
         p.presence_penalty);
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    fail(ErrorKind::kInvalidArgument, "--frequency-penalty must be in [-2, 2], got {}",
         p.frequency_penalty);
  }
  if (p.penalty_last_n < -1) {
    fail(ErrorKind::kInvalidArgument, "--repeat-last-n must be >= -1, got {}", p.penalty_last_n);
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (std::isnan(bias) || bias == INFINITY) {
      fail(ErrorKind::kInvalidArgument, "logit bias of token {} must be a number or -inf, got {}",
           id, bias);
    }
    if (id < 0 || (n_vocab > 0 && id >= n_vocab)) {
      fail(ErrorKind::kInvalidArgument,
           "logit bias for token {}: outside the vocabulary [0, {})", id, n_vocab);
    }
  }
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  check_sampling_params(params);
}

const float* Sampler::adjust(const float* logits, int64_t n_vocab,
                             std::span<const int32_t> context) {
  const SamplingParams& p = params_;
  const bool penalties =
      p.penalty_last_n != 0 && !context.empty() &&
      (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
  if (p.logit_bias.empty() && !penalties) return logits;
  adjusted_.assign(logits, logits + n_vocab);
  for (const auto& [id, bias] : p.logit_bias) {
    if (id >= 0 && id < n_vocab) adjusted_[static_cast<size_t>(id)] += bias;
  }
  if (penalties) {
    const size_t n = p.penalty_last_n < 0
                         ? context.size()
                         : std::min(context.size(), static_cast<size_t>(p.penalty_last_n));
    counts_.clear();
    for (int32_t id : context.subspan(context.size() - n)) {
      if (id >= 0 && id < n_vocab) counts_.push_back({id, 1});
    }
    std::sort(counts_.begin(), counts_.end());
    size_t w = 0;  // merge runs of one token into (token, count)
    for (size_t r = 0; r < counts_.size(); ++r) {
      if (w > 0 && counts_[w - 1].first == counts_[r].first) {
        ++counts_[w - 1].second;
      } else {
        counts_[w++] = counts_[r];
      }
    }
    counts_.resize(w);
    for (const auto& [id, count] : counts_) {
      float& x = adjusted_[static_cast<size_t>(id)];
      x = x > 0.0f ? x / p.repeat_penalty : x * p.repeat_penalty;
      x -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
    }
  }
  return adjusted_.data();
}

int32_t Sampler::sample(const float* raw, int64_t n_vocab, std::span<const int32_t> context) {
  const float* logits = adjust(raw, n_vocab, context);
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
  // Probabilities at the sampling temperature, largest first. (Every token banned by a bias of
  // -infinity: the most likely of them, as greedy would.)
  const float mx = cand_[0].first;
  if (mx == -INFINITY) return cand_[0].second;
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
