// The server's scheduler: one thread owns the Generator (continuous batching over the paged KV
// cache) and runs its steps while any request is live; HTTP threads hand it requests and read
// their events back through a Job. A Job is one HTTP request: n completions of one prompt.
//
// Latency: with a TPOT target, the tokens a step may take shrink while steps run over the target
// with prompt chunks in them, and grow back while they run under it (Sarathi-Serve's token
// budget): a long prompt is prefilled in chunks between the running sequences' decode steps
// instead of stalling them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "engine/generator.h"
#include "server/metrics.h"

namespace tandem {
class MoeRuntime;
}

namespace tandem::server {

struct SchedulerOptions {
  int parallel = 4;     // completions running at once
  int64_t queue = 256;  // completions waiting for a slot at most (more: Error(kBusy))
  int64_t max_batch_tokens = 512;  // tokens per step at most
  double tpot_target_ms = 0;       // 0: no target (every step takes max_batch_tokens)
  int retain = 8;  // finished sequences kept for their prefix (dropped first when blocks run out)
};

// One HTTP request's completions, as the scheduler thread produces them.
class Job {
 public:
  struct Event {
    int index = 0;  // which of the n completions
    GenerateEvent ev;
  };
  explicit Job(int n) : n_(n), usage_(static_cast<size_t>(n)) {}

  // Waits until the scheduler took or refused the request: false and the error when refused.
  bool wait_accepted(Error* error);
  // Events that came since the last call, waiting up to `timeout` for one; done() tells whether
  // the last completion ended.
  std::vector<Event> take(std::chrono::milliseconds timeout);
  bool done() const;
  Generator::Usage usage(int index) const;
  int n() const { return n_; }

 private:
  friend class Scheduler;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  enum class State { kWaiting, kAccepted, kRefused };  // (for the scheduler to take it)
  State state_ = State::kWaiting;
  Error error_{ErrorKind::kInternal, ""};
  std::deque<Event> events_;
  int finished_ = 0;
  std::vector<Generator::Usage> usage_;
  // scheduler thread only
  RequestId first_id_ = -1;
  std::chrono::steady_clock::time_point arrived_;
  std::vector<std::chrono::steady_clock::time_point> first_token_;
  std::vector<int64_t> tokens_;
};

class Scheduler {
 public:
  // moe: for the accelerator's counters in the metrics (may be nullptr).
  Scheduler(Model& model, KvCache& cache, const Tokenizer* tokenizer,
            const SchedulerOptions& options, Metrics& metrics, const MoeRuntime* moe = nullptr);
  ~Scheduler();  // ends every job (cancelled) and the thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Error(kBusy) "queue full" when `queue` completions wait already.
  // What the Generator refuses (a bad prompt, a prompt longer than the context) comes back
  // through Job::wait_accepted.
  std::shared_ptr<Job> submit(std::vector<int32_t> prompt, GenerateParams params, int n);
  // Cancels the job's completions at the next step (their blocks freed then).
  void cancel(const std::shared_ptr<Job>& job);

 private:
  void loop();
  void deliver(std::vector<GenerateEvent>& events);
  void adapt_budget(double step_ms, int64_t decoding, int64_t batch_tokens);

  Generator gen_;
  KvCache& cache_;
  SchedulerOptions options_;
  Metrics& metrics_;
  const MoeRuntime* moe_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  // A request handed over by an HTTP thread, for the scheduler thread to submit.
  struct Incoming {
    std::shared_ptr<Job> job;
    std::vector<int32_t> prompt;
    GenerateParams params;
  };
  std::vector<Incoming> incoming_;
  std::vector<std::shared_ptr<Job>> cancels_;
  std::atomic<int64_t> waiting_{0}, running_{0};
  int64_t incoming_completions_ = 0;
  // scheduler thread only: each running completion's job and its index there
  struct Live {
    std::shared_ptr<Job> job;
    int index = 0;
  };
  std::unordered_map<RequestId, Live> live_;
  std::thread thread_;
};

}  // namespace tandem::server
