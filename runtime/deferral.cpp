#include "runtime/deferral.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace tandem::rt {

void split_deferred(const int32_t* ids, const float* weights, int64_t k, int64_t n_defer,
                    int32_t* imm_ids, float* imm_weights, int32_t* def_ids, float* def_weights) {
  n_defer = std::clamp<int64_t>(n_defer, 0, k - 1);
  // Pick the deferred slots: repeatedly the lowest weight, later slot on ties (k is small).
  bool deferred[256] = {};
  TD_CHECK(k <= 256, "split_deferred: k {} too large", k);
  for (int64_t d = 0; d < n_defer; ++d) {
    int64_t pick = -1;
    for (int64_t j = k - 1; j >= 0; --j) {
      if (deferred[j]) continue;
      if (pick < 0 || weights[j] < weights[pick]) pick = j;
    }
    deferred[pick] = true;
  }
  int64_t ni = 0, nd = 0;
  for (int64_t j = 0; j < k; ++j) {
    if (deferred[j]) {
      def_ids[nd] = ids[j];
      def_weights[nd++] = weights[j];
    } else {
      imm_ids[ni] = ids[j];
      imm_weights[ni++] = weights[j];
    }
  }
}

DeferringMoeBackend::DeferringMoeBackend(MoeBackend* immediate, MoeBackend* deferred, int n_defer,
                                         bool async_submit)
    : immediate_(immediate), deferred_(deferred), n_defer_(n_defer) {
  if (n_defer < 0) fail(ErrorKind::kInvalidArgument, "--defer must be >= 0, got {}", n_defer);
  TD_CHECK(immediate_ != nullptr, "DeferringMoeBackend needs an immediate backend");
  TD_CHECK(n_defer == 0 || deferred_ != nullptr, "DeferringMoeBackend needs a deferred backend");
  TD_CHECK(n_defer == 0 || !deferred_->computes_shared(),
           "the deferred backend must not compute the shared experts");
  async_ = async_submit && n_defer > 0;
  if (async_) helper_ = std::thread([this] { helper_loop(); });
}

DeferringMoeBackend::~DeferringMoeBackend() {
  if (def_pending_) {
    try {
      finish_deferred();
    } catch (...) {
    }
  }
  if (helper_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    helper_.join();
  }
}

void DeferringMoeBackend::helper_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return job_ || stop_; });
    if (stop_) return;
    lock.unlock();
    std::exception_ptr error;
    try {
      deferred_->submit(def_req_);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    job_ = false;
    job_done_ = true;
    job_error_ = error;
    cv_.notify_all();
  }
}

void DeferringMoeBackend::start_deferred() {
  if (!async_) {
    deferred_->submit(def_req_);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  job_ = true;
  job_done_ = false;
  job_error_ = nullptr;
  cv_.notify_all();
}

void DeferringMoeBackend::finish_deferred() {
  def_pending_ = false;
  if (async_) {
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return job_done_; });
      error = job_error_;
      job_error_ = nullptr;
    }
    if (error) std::rethrow_exception(error);  // its submit failed: there is nothing to wait for
  }
  deferred_->wait();
}

void DeferringMoeBackend::drop_deferred() {
  if (def_pending_) finish_deferred();
}

void DeferringMoeBackend::collect_deferred(float* out, int64_t count) {
  finish_deferred();
  TD_CHECK(count == def_tokens_ * def_hidden_size_, "deferred output size mismatch");
  for (int64_t i = 0; i < count; ++i) out[i] += def_out_[i];
}

void DeferringMoeBackend::submit(const MoeRequest& r) {
  TD_CHECK(!have_current_, "DeferringMoeBackend::submit while a request is pending");
  TD_CHECK(r.slot_rows == nullptr, "DeferringMoeBackend: slot_rows are not supported");
  // A deferred part belongs to the previous MoE layer of the same decode step; anything else is
  // left over from a forward() that threw midway: finish and forget it.
  if (def_pending_ && (r.moe_index != def_moe_index_ + 1 || r.n_tokens != def_tokens_)) {
    drop_deferred();
  }
  current_ = r;
  have_current_ = true;
  const int64_t n_def = std::min<int64_t>(n_defer_, r.k - 1);
  split_current_ = n_def > 0 && r.single_token && r.moe_index < r.n_moe_layers - 1;
  if (n_defer_ > n_def && r.k != clamped_warned_k_) {
    clamped_warned_k_ = r.k;
    log_warn(
        "--defer {}: only {} of the {} selected experts can be deferred (at least one stays "
        "immediate)",
        n_defer_, n_def, r.k);
  }
  if (!split_current_) {
    ++stats_.passthrough;
    immediate_->submit(r);
    return;
  }
  const int64_t t = r.n_tokens, k = r.k, ki = k - n_def;
  imm_ids_.resize(t * ki);
  imm_w_.resize(t * ki);
  next_def_ids_.resize(t * n_def);
  next_def_w_.resize(t * n_def);
  for (int64_t i = 0; i < t; ++i) {
    split_deferred(r.ids + i * k, r.weights + i * k, k, n_def, imm_ids_.data() + i * ki,
                   imm_w_.data() + i * ki, next_def_ids_.data() + i * n_def,
                   next_def_w_.data() + i * n_def);
  }
  next_def_k_ = n_def;
  next_def_hidden_.assign(r.hidden, r.hidden + t * r.hidden_size);
  if (r.run_here != nullptr) {
    next_def_mask_.assign(r.run_here, r.run_here + r.experts->gate.size());
  } else {
    next_def_mask_.clear();
  }
  MoeRequest imm = r;
  imm.ids = imm_ids_.data();
  imm.weights = imm_w_.data();
  imm.k = ki;
  immediate_->submit(imm);
}

void DeferringMoeBackend::wait() {
  TD_CHECK(have_current_, "DeferringMoeBackend::wait without submit");
  have_current_ = false;
  immediate_->wait();
  const MoeRequest& r = current_;
  if (def_pending_) collect_deferred(r.out, r.n_tokens * r.hidden_size);
  if (!split_current_) return;
  // Start this layer's deferred experts: they run while the model computes the next layer's
  // attention and router, and are added to the next MoE layer's output.
  def_ids_.swap(next_def_ids_);
  def_w_.swap(next_def_w_);
  def_hidden_.swap(next_def_hidden_);
  def_mask_.swap(next_def_mask_);
  def_out_.resize(r.n_tokens * r.hidden_size);
  MoeRequest& d = def_req_;
  d = r;
  d.hidden = def_hidden_.data();
  d.ids = def_ids_.data();
  d.weights = def_w_.data();
  d.k = next_def_k_;
  d.run_here = def_mask_.empty() ? nullptr : def_mask_.data();
  d.out = def_out_.data();
  start_deferred();
  def_pending_ = true;
  def_moe_index_ = r.moe_index;
  def_tokens_ = r.n_tokens;
  def_hidden_size_ = r.hidden_size;
  ++stats_.deferred_requests;
  stats_.deferred_experts += r.n_tokens * next_def_k_;
}

}  // namespace tandem::rt
