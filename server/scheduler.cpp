#include "server/scheduler.h"

#include <algorithm>

#include "runtime/moe_runtime.h"

namespace tandem::server {

using Clock = std::chrono::steady_clock;

bool Job::wait_accepted(Error* error) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return state_ != State::kWaiting; });
  if (state_ == State::kRefused) *error = error_;
  return state_ == State::kAccepted;
}

std::vector<Job::Event> Job::take(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty() || finished_ == n_; });
  std::vector<Event> out(events_.begin(), events_.end());
  events_.clear();
  return out;
}

bool Job::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_ == n_ && events_.empty();
}

Generator::Usage Job::usage(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return usage_.at(static_cast<size_t>(index));
}

namespace {

GeneratorOptions generator_options(const SchedulerOptions& o) {
  GeneratorOptions g;
  g.max_batch_tokens = o.max_batch_tokens;
  g.max_sequences = o.parallel;
  g.reuse_prefix = true;
  g.retain = o.retain;
  return g;
}

}  // namespace

Scheduler::Scheduler(Model& model, KvCache& cache, const Tokenizer* tokenizer,
                     const SchedulerOptions& options, Metrics& metrics, const MoeRuntime* moe)
    : gen_(model, cache, tokenizer, generator_options(options)),
      cache_(cache),
      options_(options),
      metrics_(metrics),
      moe_(moe) {
  if (options_.parallel < 1) {
    fail(ErrorKind::kInvalidArgument, "--parallel must be >= 1, got {}", options_.parallel);
  }
  if (options_.queue < 0) {
    fail(ErrorKind::kInvalidArgument, "--queue must be >= 0, got {}", options_.queue);
  }
  if (!(options_.tpot_target_ms >= 0)) {
    fail(ErrorKind::kInvalidArgument, "--tpot-target-ms must be >= 0, got {}",
         options_.tpot_target_ms);
  }
  Gauges g;
  g.kv_blocks_total = cache_.blocks_total();
  g.batch_tokens = options_.max_batch_tokens;
  metrics_.set_gauges(g);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Job> Scheduler::submit(std::vector<int32_t> prompt, GenerateParams params, int n) {
  auto job = std::make_shared<Job>(std::max(n, 1));
  job->arrived_ = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Completions ahead of this one that no slot takes at the next step: the queue.
    const int64_t ahead = waiting_.load() + incoming_completions_;
    const int64_t free_slots = std::max<int64_t>(0, options_.parallel - running_.load());
    // (A request larger than the queue and the slots together still runs when nothing else
    // does.)
    const bool alone = ahead == 0 && running_.load() == 0;
    if (!alone && ahead + n > options_.queue + free_slots) {
      fail(ErrorKind::kBusy, "the queue is full ({} completions waiting, --queue {})", ahead,
           options_.queue);
    }
    incoming_completions_ += n;
    incoming_.push_back({job, std::move(prompt), std::move(params)});
  }
  cv_.notify_all();
  return job;
}

void Scheduler::cancel(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(job);
  }
  cv_.notify_all();
}

void Scheduler::adapt_budget(double step_ms, int64_t decoding, int64_t batch_tokens) {
  if (options_.tpot_target_ms <= 0) return;
  const int64_t floor = std::min<int64_t>(options_.max_batch_tokens, decoding + 16);
  int64_t budget = gen_.max_batch_tokens();
  if (decoding > 0 && batch_tokens > decoding && step_ms > options_.tpot_target_ms) {
    budget = std::max(floor, budget * 7 / 10);  // prompt chunks slowed the decoders: smaller
  } else if (step_ms < 0.8 * options_.tpot_target_ms || decoding == 0) {
    budget = std::min(options_.max_batch_tokens, budget * 5 / 4 + 1);
  }
  if (budget != gen_.max_batch_tokens()) gen_.set_max_batch_tokens(budget);
}

void Scheduler::deliver(std::vector<GenerateEvent>& events) {
  const auto now = Clock::now();
  for (GenerateEvent& ev : events) {
    const auto it = live_.find(ev.id);
    if (it == live_.end()) continue;
    Job& job = *it->second.job;
    const int index = it->second.index;
    const size_t i = static_cast<size_t>(index);
    if (ev.token >= 0) {
      if (job.tokens_[i]++ == 0) {
        job.first_token_[i] = now;
        metrics_.first_token(std::chrono::duration<double>(now - job.arrived_).count());
      }
    }
    const bool finished = ev.finish != FinishReason::kNone;
    Generator::Usage usage;
    if (finished) {
      usage = gen_.usage(ev.id);
      if (job.tokens_[i] > 1) {
        metrics_.time_per_output_token(
            std::chrono::duration<double>(now - job.first_token_[i]).count() /
            static_cast<double>(job.tokens_[i] - 1));
      }
      metrics_.finished(finish_reason_name(ev.finish), usage.prompt, usage.cached, usage.generated);
    }
    {
      std::lock_guard<std::mutex> lock(job.mu_);
      if (finished) {
        job.usage_[i] = usage;
        ++job.finished_;
      }
      job.events_.push_back({index, std::move(ev)});
    }
    job.cv_.notify_all();
    if (finished) live_.erase(it);
  }
}

void Scheduler::loop() {
  while (true) {
    std::vector<Incoming> incoming;
    std::vector<std::shared_ptr<Job>> cancels;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock,
               [&] { return stop_ || !incoming_.empty() || !cancels_.empty() || !gen_.idle(); });
      if (stop_) break;
      incoming.swap(incoming_);
      cancels.swap(cancels_);
      incoming_completions_ = 0;
      // (the submitted ones count as waiting until the generator's count includes them)
      int64_t added = 0;
      for (const Incoming& in : incoming) added += in.job->n();
      waiting_ = gen_.waiting() + added;
    }
    for (Incoming& in : incoming) {
      const std::shared_ptr<Job>& job = in.job;
      try {
        const RequestId first = gen_.submit(std::move(in.prompt), std::move(in.params), job->n());
        job->first_id_ = first;
        job->first_token_.resize(static_cast<size_t>(job->n()));
        job->tokens_.assign(static_cast<size_t>(job->n()), 0);
        for (int i = 0; i < job->n(); ++i) live_[first + i] = {job, i};
        std::lock_guard<std::mutex> lock(job->mu_);
        job->state_ = Job::State::kAccepted;
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(job->mu_);
        job->state_ = Job::State::kRefused;
        job->error_ = e;
      }
      job->cv_.notify_all();
    }
    for (const auto& job : cancels) {
      if (job->first_id_ < 0) continue;
      for (int i = 0; i < job->n(); ++i) {
        if (live_.count(job->first_id_ + i)) gen_.cancel(job->first_id_ + i);
      }
    }
    if (!gen_.idle()) {
      const int64_t decoding = gen_.running();
      const auto t0 = Clock::now();
      std::vector<GenerateEvent> events = gen_.step();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      adapt_budget(ms, decoding, gen_.last_batch_tokens());
      deliver(events);
    }
    waiting_ = gen_.waiting();
    running_ = gen_.running();
    Gauges g;
    g.waiting = gen_.waiting();
    g.running = gen_.running();
    g.kv_blocks_total = cache_.blocks_total();
    g.kv_blocks_used = cache_.blocks_total() - cache_.blocks_free();
    g.batch_tokens = gen_.max_batch_tokens();
    metrics_.set_gauges(g);
    if (moe_ != nullptr && moe_->hybrid_stats() != nullptr) {
      metrics_.set_accel(*moe_->hybrid_stats());
    }
  }
  // Shutdown: every live completion ends, cancelled.
  for (auto& [id, who] : live_) {
    Job& job = *who.job;
    {
      std::lock_guard<std::mutex> lock(job.mu_);
      GenerateEvent ev;
      ev.id = id;
      ev.finish = FinishReason::kCancelled;
      job.events_.push_back({who.index, ev});
      ++job.finished_;
    }
    job.cv_.notify_all();
  }
  live_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  for (Incoming& in : incoming_) {
    std::lock_guard<std::mutex> jl(in.job->mu_);
    in.job->state_ = Job::State::kRefused;
    in.job->error_ = Error(ErrorKind::kResource, "the server is shutting down");
    in.job->cv_.notify_all();
  }
}

}  // namespace tandem::server
