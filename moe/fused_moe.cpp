#include "moe/fused_moe.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/trace_events.h"
#include "model/weights.h"
#include "moe/expert_ffn.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {

struct FusedMoeBackend::Expert {
  int64_t id = 0;
  int64_t ff = 0;      // intermediate rows of this (sub-)expert
  int part = 0;        // NUMA part (0 when unsplit)
  int parts = 1;       // on an expert's first sub-expert: how many follow it (itself included)
  int32_t first = 0;   // index of the expert's first sub-expert (owner of the gathered x)
  bool fast = false;   // all three matrices have kernels
  bool whole = false;  // one phase-4 task (it gathers its own rows there)
  kern::KMatrix gate, up, down;
  // gpt-oss's biases and clamp (ops::FfnExtras::any() false elsewhere); f0: this sub-expert's
  // first intermediate row within the expert (its gate / up biases start there).
  ops::FfnExtras extras;
  int64_t f0 = 0;
  const ops::Weight* w_gate = nullptr;
  const ops::Weight* w_up = nullptr;
  const ops::Weight* w_down = nullptr;
  std::vector<int32_t> tokens;  // token of each row, in slot order
  // x, g, u, h: row-chunked experts only (a whole expert's task uses its thread's WholeScratch).
  kern::Activations x;      // gathered gate/up activations (first sub-expert only)
  std::vector<float> g, u;  // [n, ff]: gate, up; g becomes SiLU(gate) * up
  kern::Activations h;      // g converted for the down projection
  std::vector<float> y;     // [n, hidden]
  std::atomic<int64_t> gate_left{0};
  std::atomic<bool> ready{false};
};

FusedMoeBackend::FusedMoeBackend(ThreadPool* pool, FusedMoeOptions options,
                                 const CpuExperts* experts)
    : pool_(pool), options_(options), prepared_(experts) {}

FusedMoeBackend::~FusedMoeBackend() {
  for (TaskHandle& h : handles_) {
    if (h.valid()) h.wait();
  }
  if (early_.valid()) early_.wait();
}

namespace {

kern::Activations* acts_for(std::vector<kern::Activations>& v, kern::AFormat f) {
  const size_t i = static_cast<size_t>(f);
  if (v.size() <= i) v.resize(i + 1);
  return &v[i];
}

void grow_to(std::vector<float>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
}

// A phase-4 task's buffers (FusedMoeBackend::run_task), one set per thread.
void pause() {
  _mm_pause();
}

}  // namespace

void FusedMoeBackend::drop_early() {
  early_started_ = false;
  if (early_.valid()) early_.wait();
}

FusedMoeBackend::Expert& FusedMoeBackend::next_expert() {
  if (static_cast<int64_t>(experts_.size()) <= n_active_) {
    experts_.push_back(std::make_unique<Expert>());
  }
  return *experts_[n_active_++];
}

void FusedMoeBackend::add_shared(const MoeRequest& r) {
  const int64_t T = r.n_tokens, H = r.hidden_size;
  // The shared experts: one more expert over all T tokens (part 0), computed like a routed one
  // when all three matrices have kernels and gate / up take the same activations (what
  // Model::dense_ffn's kern::matmul_shared_input then does too), else by phase 3.
  shared_ = -1;
  shared_gate_.clear();
  const LayerWeights* lw = r.layer_weights;
  if (options_.shared_experts && lw != nullptr && !lw->sh_gate.empty()) {
    shared_ = n_active_;
    Expert& x = next_expert();
    x.id = -1;
    x.part = 0;
    x.parts = 1;
    x.first = static_cast<int32_t>(shared_);
    x.tokens.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) x.tokens[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    x.w_gate = &lw->sh_gate;
    x.w_up = &lw->sh_up;
    x.w_down = &lw->sh_down;
    x.ff = lw->sh_gate.rows();
    x.extras = {};
    x.f0 = 0;
    const size_t L = static_cast<size_t>(r.layer);
    if (prepared_ != nullptr && L < prepared_->shared_gate.size() &&
        prepared_->shared_gate[L].valid() && prepared_->shared_up[L].valid() &&
        prepared_->shared_down[L].valid()) {  // repack: rearranged like the routed experts
      x.gate = prepared_->shared_gate[L];
      x.up = prepared_->shared_up[L];
      x.down = prepared_->shared_down[L];
      x.fast = true;
    } else {
      x.fast = kern::view_weight(lw->sh_gate, &x.gate) && kern::view_weight(lw->sh_up, &x.up) &&
               kern::view_weight(lw->sh_down, &x.down);
    }
    x.fast = x.fast && x.gate.format == x.up.format && x.gate.group == x.up.group;
    if (!lw->sh_gate_inp.empty()) {
      for (int64_t t = 0; t < T; ++t) {
        shared_gate_.push_back(shared_expert_gate(r.hidden + t * H, lw->sh_gate_inp.data(), H));
      }
    }
  }
}

void FusedMoeBackend::start_shared(const MoeRequest& r) {
  TD_CHECK(!pending_, "FusedMoeBackend::begin while a request is pending");
  drop_early();  // (one begun for a request that never came: a forward() that threw midway)
  early_tasks_count_ = 0;
  const LayerWeights* lw = r.layer_weights;
  if (!options_.shared_experts || pool_ == nullptr || r.n_tokens > 4 || lw == nullptr ||
      lw->sh_gate.empty()) {
    return;
  }
  const size_t L = static_cast<size_t>(r.layer);
  if (prepared_ != nullptr && L < prepared_->parts.size() && !prepared_->parts[L].empty()) {
    return;  // NUMA parts: the shared expert stays in part 0's job
  }
  // Every entry submit() can use exists now: experts_ must not reallocate under the job.
  const size_t most = r.experts->gate.size() + 1;
  while (experts_.size() < most) experts_.push_back(std::make_unique<Expert>());
  n_active_ = 0;
  add_shared(r);
  Expert& x = *experts_[0];
  if (!x.fast || x.ff == 0) {
    n_active_ = 0;
    shared_ = -1;
    return;  // the reference path: the shared expert runs in the layer's queue (submit)
  }
  req_ = r;
  const int64_t T = r.n_tokens, H = r.hidden_size;
  kern::Activations* all = acts_for(hidden_acts_, kern::act_format(x.gate.format));
  kern::quantize_activations(kern::act_format(x.gate.format), x.gate.group, r.hidden, T, H, H, all,
                             nullptr);
  grow_to(x.y, T * H);
  grow_to(x.g, T * x.ff);
  grow_to(x.u, T * x.ff);
  x.ready.store(false, std::memory_order_relaxed);
  gather(x, &x.x);  // (all stays valid: submit() finds the same hidden states in it)
  // Long streams, as a decode layer's (max_rows_per_task_decode): gate/up in ceil(ff / (cap / 2))
  // equal chunks, down in ceil(H / cap); gate/up chunks first (a down chunk waits for them).
  const int64_t cap = std::max<int64_t>(32, options_.max_rows_per_task_decode);
  auto even = [](int64_t rows, int64_t per) {
    const int64_t n = (rows + per - 1) / per;
    return std::max<int64_t>(16, ((rows + n - 1) / n + 15) / 16 * 16);
  };
  early_tasks_.clear();
  const int64_t gu = even(x.ff, cap / 2), dn = even(H, cap);
  int64_t n_gate = 0;
  for (int64_t r0 = 0; r0 < x.ff; r0 += gu, ++n_gate) {
    early_tasks_.push_back({0, 0, r0, std::min(x.ff, r0 + gu)});
  }
  x.gate_left.store(n_gate, std::memory_order_relaxed);
  for (int64_t r0 = 0; r0 < H; r0 += dn) early_tasks_.push_back({0, 1, r0, std::min(H, r0 + dn)});
  early_tasks_count_ = static_cast<int64_t>(early_tasks_.size());
  early_started_ = true;
  early_ = pool_->submit(early_tasks_.size(), [this](size_t i) { run_task(early_tasks_[i]); });
}

void FusedMoeBackend::submit(const MoeRequest& r) {
  TD_CHECK(!pending_, "FusedMoeBackend::submit while a request is pending");
  const int64_t n_experts = static_cast<int64_t>(r.experts->gate.size());
  const bool prepared = prepared_ != nullptr &&
                        static_cast<size_t>(r.layer) < prepared_->gate.size() &&
                        static_cast<int64_t>(prepared_->gate[r.layer].size()) == n_experts;
  const bool split = prepared && static_cast<size_t>(r.layer) < prepared_->parts.size() &&
                     !prepared_->parts[r.layer].empty();
  const int n_parts = split ? static_cast<int>(prepared_->part_node.size()) : 1;
  if (early_started_ && (r.layer != req_.layer || r.hidden != req_.hidden ||
                         r.n_tokens != req_.n_tokens || r.experts != req_.experts)) {
    drop_early();  // begun for another request: this one computes its shared expert itself
  }
  if (!early_started_) early_tasks_count_ = 0;
  route(r, prepared, split ? n_parts : 0);
  if (!early_started_) add_shared(r);
  req_ = r;
  choose_whole_experts(r.n_tokens, split);
  prepare_activations(r);
  launch(split, n_parts);
}

// Which experts are active and which rows they get (in slot order): experts_[0, n_active_), each
// split expert as n_parts consecutive sub-experts, the first owning the token rows.
void FusedMoeBackend::route(const MoeRequest& r, bool prepared, int n_parts) {
  const int64_t T = r.n_tokens, K = r.k;
  const int64_t n_experts = static_cast<int64_t>(r.experts->gate.size());
  std::vector<int32_t>& index_of = index_of_;  // reused: no allocation per layer
  index_of.assign(static_cast<size_t>(n_experts), -1);
  slot_row_.assign(static_cast<size_t>(T * K), -1);
  slot_expert_.assign(static_cast<size_t>(T * K), -1);
  n_active_ = early_started_ ? 1 : 0;  // (start_shared()'s shared expert is experts_[0])
  for (int64_t i = 0; i < T * K; ++i) {
    const int32_t e = r.ids[i];
    if (e == -1) continue;  // an empty slot (MoeRequest::ids)
    TD_CHECK(e >= 0 && e < n_experts, "expert id {} out of range", e);
    if (r.run_here != nullptr && r.run_here[e] == 0) continue;
    if (index_of[e] < 0) {
      index_of[e] = static_cast<int32_t>(n_active_);
      activate(r, e, prepared, n_parts);
    }
    Expert& x = *experts_[index_of[e]];
    slot_expert_[i] = index_of[e];
    slot_row_[i] = static_cast<int32_t>(x.tokens.size());
    x.tokens.push_back(static_cast<int32_t>(i / K));
  }
}

// Expert e of the request as the next active entry (or, split into n_parts > 0 parts, the next
// n_parts entries), its weights: the prepared ones, else views of the stored ones.
void FusedMoeBackend::activate(const MoeRequest& r, int32_t e, bool prepared, int n_parts) {
  const int32_t first = static_cast<int32_t>(n_active_);
  Expert& x = next_expert();
  x.id = e;
  x.part = 0;
  x.parts = 1;
  x.first = first;
  x.tokens.clear();
  x.w_gate = &r.experts->gate[e];
  x.w_up = &r.experts->up[e];
  x.w_down = &r.experts->down[e];
  x.ff = x.w_gate->rows();
  x.extras = r.experts->extras(e);
  x.f0 = 0;
  const std::vector<ExpertPart>* parts = n_parts > 0 ? &prepared_->parts[r.layer][e] : nullptr;
  if (parts != nullptr && !parts->empty()) {
    // Sub-expert p: part p's slices (an empty part becomes a sub-expert with ff = 0, skipped by
    // the tasks and the combine).
    x.parts = n_parts;
    for (int p = 0; p < n_parts; ++p) {
      Expert& s = p == 0 ? x : next_expert();
      const ExpertPart& part = (*parts)[static_cast<size_t>(p)];
      if (p > 0) {
        s.id = e;
        s.parts = 1;
        s.first = first;
        s.w_gate = x.w_gate;
        s.w_up = x.w_up;
        s.w_down = x.w_down;
        // Every part's down output is a partial sum over its columns: the bias once.
        s.extras = x.extras;
        s.extras.down_bias = nullptr;
      }
      s.part = p;
      s.f0 = part.f0;
      s.ff = part.f1 - part.f0;
      s.gate = part.gate;
      s.up = part.up;
      s.down = part.down;
      s.fast = true;
    }
  } else if (prepared) {
    x.gate = prepared_->gate[r.layer][e];
    x.up = prepared_->up[r.layer][e];
    x.down = prepared_->down[r.layer][e];
    x.fast = x.gate.valid() && x.up.valid() && x.down.valid();
  } else {
    x.fast = kern::view_weight(*x.w_gate, &x.gate) && kern::view_weight(*x.w_up, &x.up) &&
             kern::view_weight(*x.w_down, &x.down);
  }
  x.fast = x.fast && x.gate.format == x.up.format && x.gate.group == x.up.group;
}

// A prefill's many experts (FusedMoeOptions::whole_experts_per_thread): each routed one whole in
// one task (phase 4) on one thread, largest first; the smallest `threads` stay in row chunks
// (with the shared experts) so that the threads still finish together. The task gathers its
// expert's rows itself, so its activations, gate / up outputs, their down-projection encoding
// and its output stay in that core's cache, where row chunks spread each expert over the cores
// (chunks reading rows another core gathered, the last one converting gate / up rows that
// every core wrote).
void FusedMoeBackend::choose_whole_experts(int64_t T, bool split) {
  whole_.clear();
  for (int64_t a = 0; a < n_active_; ++a) experts_[a]->whole = false;
  const int64_t per_thread = options_.whole_experts_per_thread;
  if (per_thread <= 0 || pool_ == nullptr || T <= 4 || split) return;
  const int64_t threads = pool_->size() + 1;
  for (int64_t a = 0; a < n_active_; ++a) {
    if (a != shared_ && experts_[a]->fast && experts_[a]->ff > 0) {
      whole_.push_back(static_cast<int32_t>(a));
    }
  }
  if (static_cast<int64_t>(whole_.size()) < per_thread * threads) {
    whole_.clear();
    return;
  }
  auto work = [&](int32_t a) {
    return static_cast<int64_t>(experts_[a]->tokens.size()) * experts_[a]->ff;
  };
  std::stable_sort(whole_.begin(), whole_.end(),
                   [&](int32_t p, int32_t q) { return work(p) > work(q); });
  whole_.resize(whole_.size() - static_cast<size_t>(threads));
  for (int32_t a : whole_) experts_[a]->whole = true;
}

// Activations: the hidden states once per encoding (on the pool), then each expert's rows
// gathered into its first sub-expert (the other parts read them there), the experts in parallel
// for a prefill (a 512-token V2-Lite layer copies ~13 MB: ~10% of the layer on the caller alone).
void FusedMoeBackend::prepare_activations(const MoeRequest& r) {
  const int64_t T = r.n_tokens, H = r.hidden_size;
  const int64_t a0 = early_started_ ? 1 : 0;  // (start_shared() prepared its shared expert)
  for (int64_t a = a0; a < n_active_; ++a) {
    const Expert& x = *experts_[a];
    if (x.first != a || !x.fast) continue;
    const kern::AFormat af = kern::act_format(x.gate.format);
    kern::Activations* all = acts_for(hidden_acts_, af);
    if (all->tokens != T || all->format != af || all->cols != H || all->group != x.gate.group) {
      kern::quantize_activations(af, x.gate.group, r.hidden, T, H, H, all, pool_);
    }
  }
  auto prepare = [&](size_t i) {
    const int64_t a = static_cast<int64_t>(i);
    if (a < a0) return;  // start_shared()'s, running
    Expert& x = *experts_[i];
    const Expert& owner = *experts_[x.first];
    if (x.first != a) x.tokens = owner.tokens;
    const int64_t n = static_cast<int64_t>(x.tokens.size());
    // Grow only: a resize down and up again would zero the regrown part on every request (a
    // slot's expert and row count change per layer), ~1 MB per V2-Lite expert of a prefill.
    grow_to(x.y, n * H);
    x.ready.store(false, std::memory_order_relaxed);
    if (!x.fast || x.whole) return;  // (a whole expert's task has its own buffers)
    grow_to(x.g, n * x.ff);
    grow_to(x.u, n * x.ff);
    // The first sub-expert gathers even when its own part is empty: the other parts read it.
    if (x.first == a) gather(x, &x.x);
  };
  // (A sub-expert copies its owner's token list, which no task writes.)
  if (pool_ != nullptr && T > 8) {
    pool_->run(static_cast<size_t>(n_active_), prepare);
  } else {
    for (int64_t a = 0; a < n_active_; ++a) prepare(static_cast<size_t>(a));
  }
  // Invalidate the per-encoding caches for the next request.
  for (kern::Activations& a : hidden_acts_) a.tokens = -1;
}

// Each part's tasks (add_tasks), then one pool job per part on its node's workers (inline without
// a pool); wait() joins them.
void FusedMoeBackend::launch(bool split, int n_parts) {
  tasks_.clear();
  part_begin_.assign(1, 0);
  for (int p = 0; p < n_parts; ++p) {
    const int node = split ? prepared_->part_node[static_cast<size_t>(p)] : -1;
    const int64_t threads =
        pool_ == nullptr ? 1 : (node < 0 ? pool_->size() : pool_->workers_on_node(node)) + 1;
    add_tasks(p, threads);
    part_begin_.push_back(tasks_.size());
  }
  pending_ = true;
  handles_.clear();
  if (tasks_.empty()) return;
  if (pool_ == nullptr) {
    for (const Task& t : tasks_) run_task(t);
    return;
  }
  for (int p = 0; p < n_parts; ++p) {
    const size_t b = part_begin_[static_cast<size_t>(p)], n = part_begin_[p + 1] - b;
    RunOptions ro;
    ro.node = split ? prepared_->part_node[static_cast<size_t>(p)] : -1;
    handles_.push_back(pool_->submit(ro, n, [this, b](size_t i) { run_task(tasks_[b + i]); }));
  }
}

// x's token rows of the request's hidden states in its gate / up encoding (quantized by submit).
void FusedMoeBackend::gather(const Expert& x, kern::Activations* out) const {
  const int64_t n = static_cast<int64_t>(x.tokens.size());
  const size_t enc = static_cast<size_t>(kern::act_format(x.gate.format));
  const kern::Activations& all = hidden_acts_[enc];
  out->format = all.format;
  out->tokens = n;
  out->cols = req_.hidden_size;
  out->group = all.group;
  out->row_bytes = all.row_bytes;
  if (out->data.size() < static_cast<size_t>(n * all.row_bytes)) {
    out->data.resize(static_cast<size_t>(n * all.row_bytes));
  }
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(out->data.data() + j * all.row_bytes, all.row(x.tokens[j]),
                static_cast<size_t>(all.row_bytes));
  }
}

// Part `part`'s tasks: its sub-experts' gate/up chunks, then their down chunks.
void FusedMoeBackend::add_tasks(int part, int64_t threads) {
  const int64_t H = req_.hidden_size;
  // Chunks: >= ~4 tasks per thread over the part's work, multiples of 16 rows, capped.
  int64_t total_rows = 0;
  const int64_t a0 = early_started_ ? 1 : 0;  // (start_shared()'s shared expert has its own job)
  for (int64_t a = a0; a < n_active_; ++a) {
    const Expert& x = *experts_[a];
    if (x.part == part && x.fast && x.ff > 0) total_rows += 2 * x.ff + H;
  }
  int64_t chunk = total_rows / (4 * threads);
  const int64_t cap =
      req_.n_tokens <= 4 ? options_.max_rows_per_task_decode : options_.max_rows_per_task;
  chunk = std::clamp<int64_t>(chunk / 16 * 16, 16, std::max<int64_t>(16, cap));
  for (int64_t a = a0; a < n_active_; ++a) {
    Expert& x = *experts_[a];
    if (x.part != part || x.ff == 0) continue;
    if (!x.fast) {
      tasks_.push_back({static_cast<int32_t>(a), a == shared_ ? 3 : 2, 0, 0});
      continue;
    }
    if (x.whole) continue;
    // gate+up chunks count double, so they get half the rows.
    const int64_t gu = std::max<int64_t>(16, chunk / 2 / 16 * 16);
    int64_t n_gate = 0;
    for (int64_t r0 = 0; r0 < x.ff; r0 += gu, ++n_gate) {
      tasks_.push_back({static_cast<int32_t>(a), 0, r0, std::min(x.ff, r0 + gu)});
    }
    x.gate_left.store(n_gate, std::memory_order_relaxed);
  }
  // The whole experts (part 0: they are never split) between the chunked ones' gate/up and down
  // chunks, which are then long done.
  if (part == 0) {
    for (int32_t a : whole_) tasks_.push_back({a, 4, 0, 0});
  }
  // Down chunks after every gate/up chunk: a worker reaching one finds its expert's gate/up chunks
  // already claimed (they precede it in the queue), so waiting for them cannot deadlock.
  const size_t first_down = tasks_.size();
  for (int64_t a = a0; a < n_active_; ++a) {
    Expert& x = *experts_[a];
    if (x.part != part || !x.fast || x.ff == 0 || x.whole) continue;
    for (int64_t r0 = 0; r0 < H; r0 += chunk) {
      tasks_.push_back({static_cast<int32_t>(a), 1, r0, std::min(H, r0 + chunk)});
    }
  }
  // The tail: the last `threads` down chunks in pieces (row_align: every format's row tile
  // divides 16).
  const int pieces = options_.tail_pieces;
  const size_t n_down = tasks_.size() - first_down;
  if (pieces > 1 && n_down > 0) {
    const size_t tail = std::min(n_down, static_cast<size_t>(threads));
    tail_.assign(tasks_.end() - static_cast<std::ptrdiff_t>(tail), tasks_.end());
    tasks_.resize(tasks_.size() - tail);
    for (const Task& t : tail_) {
      const int64_t rows = t.r1 - t.r0;
      const int64_t step = std::max<int64_t>(16, (rows + pieces - 1) / pieces / 16 * 16);
      for (int64_t r0 = t.r0; r0 < t.r1; r0 += step) {
        tasks_.push_back({t.expert, 1, r0, std::min(t.r1, r0 + step)});
      }
    }
  }
}

void FusedMoeBackend::run_task(const Task& t) {
  Expert& x = *experts_[t.expert];
  const int64_t n = static_cast<int64_t>(x.tokens.size());
  const int64_t H = req_.hidden_size;
  static constexpr const char* kPhase[] = {"expert gate+up", "expert down", "expert",
                                           "shared expert", "expert"};
  const trace::Span span(kPhase[t.phase], "cpu experts",
                         {.layer = req_.layer, .expert = x.id, .tokens = n});
  if (t.phase == 2) {  // reference path: the whole expert here
    std::vector<float> in(static_cast<size_t>(n * H)), g, u;
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(in.data() + j * H, req_.hidden + x.tokens[j] * H, static_cast<size_t>(H) * 4);
    }
    ops::swiglu_ffn(*x.w_gate, *x.w_up, *x.w_down, in.data(), n, x.y.data(), nullptr, &g, &u,
                    x.extras);
    x.ready.store(true, std::memory_order_release);
    return;
  }
  if (t.phase == 3) {  // the shared experts without the fast path, as Model::dense_ffn
    std::vector<float> g, u;
    kern::swiglu_ffn(*x.w_gate, *x.w_up, *x.w_down, req_.hidden, n, x.y.data(), nullptr, nullptr,
                     &g, &u);
    x.ready.store(true, std::memory_order_release);
    return;
  }
  if (t.phase == 4) {
    // The whole expert on this thread: its gathered rows, gate / up outputs and their down
    // encoding in this thread's scratch, which the previous whole expert left in the core's cache
    // (per-expert buffers would come from memory last written a layer ago: a store miss per
    // line).
    thread_local kern::Activations in;
    thread_local expert::Scratch s;
    gather(x, &in);
    expert::whole(x.gate, x.up, x.down, x.extras, in, &s, x.y.data(),
                  [](const kern::KMatrix& w, const kern::Activations& a, float* y) {
                    kern::gemm(w, a, 0, w.rows, y, w.rows);
                  });
    x.ready.store(true, std::memory_order_release);
    return;
  }
  if (t.phase == 0) {
    const kern::Activations& in = experts_[x.first]->x;
    kern::gemm(x.gate, in, t.r0, t.r1, x.g.data(), x.ff);
    kern::gemm(x.up, in, t.r0, t.r1, x.u.data(), x.ff);
    expert::glu_rows(x.g.data() + t.r0, x.u.data() + t.r0, n, x.ff, x.f0 + t.r0, t.r1 - t.r0,
                     x.extras);
    if (x.gate_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      kern::quantize_activations(kern::act_format(x.down.format), x.down.group, x.g.data(), n, x.ff,
                                 x.ff, &x.h);
      x.ready.store(true, std::memory_order_release);
    }
    return;
  }
  // Down rows of this expert, once its intermediate rows are complete.
  for (int spins = 0; !x.ready.load(std::memory_order_acquire); ++spins) {
    if (spins < 4096) {
      pause();
    } else {
      std::this_thread::yield();
    }
  }
  kern::gemm(x.down, x.h, t.r0, t.r1, x.y.data(), H);
  expert::add_down_bias(x.y.data(), n, H, t.r0, t.r1 - t.r0, x.extras);
}

void FusedMoeBackend::wait() {
  TD_CHECK(pending_, "FusedMoeBackend::wait without submit");
  pending_ = false;
  // The routed job first: the caller helps it, and start_shared()'s job (lower slot, which the worker
  // took first) is long done or nearly.
  for (TaskHandle& h : handles_) {
    if (h.valid()) h.wait();
  }
  drop_early();
  // Combine per token in slot order: deterministic whichever worker computed what.
  const MoeRequest& r = req_;
  const int64_t H = r.hidden_size, K = r.k;
  // One statement adds every row, ours and another backend's (slot_rows): the same arithmetic
  // (contracted or not) whichever computed the expert.
  auto add_row = [H](float* dst, float w, const float* src) {
    for (int64_t c = 0; c < H; ++c) dst[c] += w * src[c];
  };
  auto combine = [&](size_t t) {
    float* dst = r.out + static_cast<int64_t>(t) * H;
    std::fill(dst, dst + H, 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t i = static_cast<int64_t>(t) * K + j;
      const float w = r.weights[i];
      if (slot_expert_[i] < 0) {
        if (r.slot_rows != nullptr && r.slot_rows[i] != nullptr) add_row(dst, w, r.slot_rows[i]);
        continue;
      }
      const int32_t a = slot_expert_[i];
      for (int p = 0; p < experts_[a]->parts; ++p) {  // NUMA parts in order
        const Expert& x = *experts_[a + p];
        if (x.ff == 0) continue;
        add_row(dst, w, x.y.data() + slot_row_[i] * H);
      }
    }
    if (shared_ >= 0) {  // Model::ffn: (shared * gate) + routed, the product rounded first
      float* sy = experts_[static_cast<size_t>(shared_)]->y.data() + static_cast<int64_t>(t) * H;
      if (!shared_gate_.empty()) {
        const float gate = shared_gate_[t];
        for (int64_t c = 0; c < H; ++c) sy[c] *= gate;
      }
      for (int64_t c = 0; c < H; ++c) dst[c] += sy[c];
    }
  };
  if (pool_ != nullptr && r.n_tokens > 8) {
    const trace::Span span("combine", "cpu experts", {.layer = r.layer, .tokens = r.n_tokens});
    pool_->run(static_cast<size_t>(r.n_tokens), combine);
  } else {
    for (int64_t t = 0; t < r.n_tokens; ++t) combine(static_cast<size_t>(t));
  }
}

}  // namespace tandem
