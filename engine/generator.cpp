#include "engine/generator.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContext: return "context";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

struct Generator::Request {
  enum class State { kWaiting, kSibling, kPrefill, kDecode, kDone };
  RequestId id = -1;
  State state = State::kWaiting;
  std::vector<int32_t> tokens;  // the prompt, then the generated tokens
  int64_t prompt = 0;           // tokens[0, prompt): the prompt
  int64_t fed = 0;              // tokens whose keys and values the sequence holds
  int64_t reported = 0;         // prompt positions whose logits went to on_prompt_logits
  int64_t cached = 0;           // prompt tokens that came from a kept prefix
  int64_t generated = 0;
  GenerateParams params;
  Sampler sampler;
  SeqId seq = -1;
  std::vector<Request*> siblings;      // the completions waiting for this one's prefill
  std::unique_ptr<TokenStreamDecoder> text;
  std::string held;  // decoded text not yet emitted: it may be the start of a stop string
  bool cancelled = false;

  Request(RequestId i, std::vector<int32_t> t, GenerateParams p)
      : id(i), tokens(std::move(t)), params(std::move(p)), sampler(params.sampling) {
    prompt = static_cast<int64_t>(tokens.size());
  }
};

Generator::Generator(Model& model, KvCache& cache, const Tokenizer* tokenizer,
                     const GeneratorOptions& options)
    : model_(model), cache_(cache), tokenizer_(tokenizer), options_(options) {
  if (options_.max_batch_tokens < 1) {
    fail(ErrorKind::kInvalidArgument, "the batch needs at least one token, got {}",
         options_.max_batch_tokens);
  }
  if (!(cache_.layout() == model_.kv_layout())) {
    fail(ErrorKind::kInvalidArgument, "Generator: the KV cache was made for another model");
  }
}

void Generator::set_max_batch_tokens(int64_t tokens) {
  if (tokens < 1) {
    fail(ErrorKind::kInvalidArgument, "the batch needs at least one token, got {}", tokens);
  }
  options_.max_batch_tokens = tokens;
}

Generator::~Generator() {
  for (const auto& r : requests_) {
    if (r->seq >= 0 && cache_.contains(r->seq)) cache_.release(r->seq);
  }
  clear_retained();
}

RequestId Generator::submit(std::vector<int32_t> prompt, GenerateParams params, int n) {
  const int64_t nv = model_.config().vocab_size;
  if (prompt.empty()) fail(ErrorKind::kInvalidArgument, "the prompt is empty");
  if (n < 1) fail(ErrorKind::kInvalidArgument, "n must be >= 1, got {}", n);
  for (int32_t id : prompt) {
    if (id < 0 || id >= nv) {
      fail(ErrorKind::kOutOfRange, "token id {} is outside the vocabulary [0, {})", id, nv);
    }
  }
  check_sampling_params(params.sampling, nv);
  if (params.max_tokens < -1) {
    fail(ErrorKind::kInvalidArgument, "max_tokens must be >= 0 (or -1: no limit), got {}",
         params.max_tokens);
  }
  if (params.top_logprobs > 20) {
    fail(ErrorKind::kInvalidArgument, "top_logprobs must be at most 20, got {}",
         params.top_logprobs);
  }
  for (int32_t id : params.stop_tokens) {
    if (id < 0 || id >= nv) {
      fail(ErrorKind::kOutOfRange, "stop token {} is outside the vocabulary [0, {})", id, nv);
    }
  }
  const int64_t ctx = cache_.max_sequence_positions();
  if (static_cast<int64_t>(prompt.size()) > ctx) {
    fail(ErrorKind::kOutOfRange, "the prompt has {} tokens, more than the context size {}",
         prompt.size(), ctx);
  }
  const RequestId first = next_id_;
  Request* parent = nullptr;
  for (int i = 0; i < n; ++i) {
    GenerateParams p = params;
    p.sampling.seed = params.sampling.seed + static_cast<uint64_t>(i);
    if (i > 0) p.on_prompt_logits = nullptr;  // (the shared prefill reports once)
    auto r = std::make_unique<Request>(next_id_++, prompt, std::move(p));
    if (tokenizer_ != nullptr) {
      // A continuation's decoder sees the prompt first (a SentencePiece piece's leading space
      // depends on what precedes it).
      r->text = std::make_unique<TokenStreamDecoder>(*tokenizer_, params.special_text);
      if (params.continues_prompt) {
        for (int32_t t : prompt) r->text->push(t);
        r->text->flush();
      }
    }
    if (i == 0) {
      parent = r.get();
    } else {
      r->state = Request::State::kSibling;
      parent->siblings.push_back(r.get());
    }
    requests_.push_back(std::move(r));
  }
  return first;
}

Generator::Request* Generator::find(RequestId id) const {
  for (const auto& r : requests_) {
    if (r->id == id) return r.get();
  }
  return nullptr;
}

void Generator::cancel(RequestId id) {
  if (Request* r = find(id)) r->cancelled = true;
}

int64_t Generator::waiting() const {
  return std::count_if(requests_.begin(), requests_.end(), [](const auto& r) {
    return r->state == Request::State::kWaiting || r->state == Request::State::kSibling;
  });
}

int64_t Generator::running() const {
  return std::count_if(requests_.begin(), requests_.end(), [](const auto& r) {
    return r->state == Request::State::kPrefill || r->state == Request::State::kDecode;
  });
}

Generator::Usage Generator::usage(RequestId id) const {
  const Request* r = find(id);
  if (r == nullptr) fail(ErrorKind::kInvalidArgument, "no request {}", id);
  return Usage{r->prompt, r->cached, r->generated};
}

const std::vector<int32_t>& Generator::tokens(RequestId id) const {
  const Request* r = find(id);
  if (r == nullptr) fail(ErrorKind::kInvalidArgument, "no request {}", id);
  return r->tokens;
}

void Generator::clear_retained() {
  while (!retained_.empty()) drop_retained();
}

void Generator::drop_retained() {
  const SeqId s = retained_.front();
  retained_.pop_front();
  if (cache_.contains(s)) cache_.release(s);
}

bool Generator::is_end(const Request& r, int32_t token) const {
  if (std::find(r.params.stop_tokens.begin(), r.params.stop_tokens.end(), token) !=
      r.params.stop_tokens.end()) {
    return true;
  }
  if (r.params.ignore_eos) return false;
  return tokenizer_ != nullptr ? tokenizer_->is_end_of_generation(token)
                               : token == model_.config().eos_token_id;
}

// A waiting request's sequence: a fork of the longest prefix a sequence holds (at least one
// prompt token left to feed: its logits), or a new one; taken only if its prompt fits in the
// free blocks (after the kept sequences). false: not now.
bool Generator::admit(Request& r, int64_t reserve) {
  const int64_t target = static_cast<int64_t>(r.tokens.size());
  // A recurrent state's slot for it and for each completion forked from it (kept sequences give
  // theirs back first).
  const int64_t slots = 1 + static_cast<int64_t>(r.siblings.size());
  if (cache_.has_state()) {
    while (cache_.state_slots_available() < slots && !retained_.empty()) drop_retained();
    if (cache_.state_slots_available() < slots) return false;
  }
  KvCache::PrefixMatch m;
  if (options_.reuse_prefix) {
    m = cache_.longest_prefix(std::span<const int32_t>(r.tokens.data(), r.tokens.size()));
  }
  // (A recurrent state resumes at a checkpoint: the length kept may be shorter than asked.)
  const SeqId seq = m.length > 0 ? cache_.fork(m.seq) : cache_.create();
  const int64_t keep = cache_.truncate(seq, std::min(m.length, target - 1));
  const std::span<const int32_t> rest(r.tokens.data() + keep, r.tokens.size() - keep);
  const KvCache::Write w{seq, keep, rest};
  const std::span<const KvCache::Write> ws(&w, 1);
  while (cache_.blocks_needed(ws) + reserve > cache_.blocks_free() && !retained_.empty()) {
    if (retained_.front() == m.seq) {  // (the prefix it forked stays shared: drop it first)
      retained_.pop_front();
      cache_.release(m.seq);
      continue;
    }
    drop_retained();
  }
  if (cache_.blocks_needed(ws) + reserve > cache_.blocks_free()) {
    cache_.release(seq);
    return false;
  }
  r.seq = seq;
  r.fed = keep;
  if (r.generated == 0) r.cached = keep;
  r.state = Request::State::kPrefill;
  return true;
}

void Generator::retire(Request& r, bool keep_prefix) {
  r.state = Request::State::kDone;
  if (r.seq >= 0 && cache_.contains(r.seq)) {
    if (keep_prefix && options_.reuse_prefix && options_.retain > 0) {
      retained_.push_back(r.seq);
      while (static_cast<int>(retained_.size()) > options_.retain) drop_retained();
    } else {
      cache_.release(r.seq);
    }
  }
  r.seq = -1;
}

void Generator::finish(Request& r, FinishReason reason, std::vector<GenerateEvent>* events,
                       std::string error) {
  GenerateEvent ev;
  ev.id = r.id;
  ev.finish = reason;
  ev.error = std::move(error);
  if (reason != FinishReason::kError) emit_text(r, ev, true);
  events->push_back(std::move(ev));
  retire(r, reason != FinishReason::kError);
  // Completions still waiting for this request's prefill cannot start.
  for (Request* s : r.siblings) {
    if (s->state != Request::State::kSibling) continue;
    s->state = Request::State::kDone;
    GenerateEvent se;
    se.id = s->id;
    se.finish =
        reason == FinishReason::kCancelled ? FinishReason::kCancelled : FinishReason::kError;
    if (se.finish == FinishReason::kError) se.error = "the shared prompt did not complete";
    events->push_back(std::move(se));
  }
  r.siblings.clear();
}

// The text the new tokens completed, without what may still become a stop string (at_end: all
// of it, up to a stop string).
void Generator::emit_text(Request& r, GenerateEvent& ev, bool at_end) {
  if (r.text == nullptr) return;
  if (at_end) r.held += r.text->flush();
  size_t cut = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& s : r.params.stop) {
    if (s.empty()) continue;
    const size_t at = r.held.find(s);
    if (at != std::string::npos && at < cut) {
      cut = at;
      matched = &s;
    }
  }
  if (cut != std::string::npos) {
    ev.text += r.held.substr(0, cut);
    r.held.clear();
    if (ev.finish == FinishReason::kNone || ev.finish == FinishReason::kStop) {
      ev.finish = FinishReason::kStop;
      ev.stop = *matched;
    }
    return;
  }
  size_t keep = 0;  // the longest tail that begins a stop string
  if (!at_end) {
    for (const std::string& s : r.params.stop) {
      for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), r.held.size()); k > keep; --k) {
        if (r.held.compare(r.held.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
      }
    }
  }
  ev.text += r.held.substr(0, r.held.size() - keep);
  r.held.erase(0, r.held.size() - keep);
}

// The next token of r from its last logits row; r finishes on an end token, a stop string,
// max_tokens or a full context.
void Generator::sample(Request& r, const float* row, std::vector<GenerateEvent>* events) {
  const int64_t nv = model_.config().vocab_size;
  const int32_t t = r.sampler.sample(row, nv, r.tokens);
  GenerateEvent ev;
  ev.id = r.id;
  ev.token = t;
  if (r.params.top_logprobs >= 0) {
    // Under the model's distribution (the logits as computed).
    const float mx = *std::max_element(row, row + nv);
    double sum = 0;
    for (int64_t i = 0; i < nv; ++i) sum += std::exp(static_cast<double>(row[i]) - mx);
    const float log_z = mx + static_cast<float>(std::log(sum));
    ev.logprob = row[t] - log_z;
    std::vector<int32_t> ids(static_cast<size_t>(nv));
    for (int64_t i = 0; i < nv; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const size_t k = std::min<size_t>(static_cast<size_t>(r.params.top_logprobs), ids.size());
    std::partial_sort(
        ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
        [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (size_t i = 0; i < k; ++i) ev.top_logprobs.push_back({ids[i], row[ids[i]] - log_z});
  }
  r.tokens.push_back(t);
  ++r.generated;
  r.state = Request::State::kDecode;
  if (is_end(r, t)) {
    ev.finish = FinishReason::kStop;
  } else if (r.text != nullptr) {
    r.held += r.text->push(t);
  }
  if (ev.finish == FinishReason::kNone) {
    if (r.params.max_tokens >= 0 && r.generated >= r.params.max_tokens) {
      ev.finish = FinishReason::kLength;
    } else if (r.fed >= cache_.max_sequence_positions()) {
      ev.finish = FinishReason::kContext;  // the new token has no position left
    }
  }
  emit_text(r, ev, ev.finish != FinishReason::kNone);  // (a stop string finishes it too)
  const bool done = ev.finish != FinishReason::kNone;
  events->push_back(std::move(ev));
  if (done) retire(r, true);
}

std::vector<GenerateEvent> Generator::step() {
  Events events;
  using State = Request::State;
  // Requests finished in the last step leave now (usage() and tokens() answered until then).
  std::erase_if(requests_, [](const auto& r) { return r->state == State::kDone; });
  for (const auto& r : requests_) {
    if (r->cancelled && r->state != State::kDone) finish(*r, FinishReason::kCancelled, &events);
  }
  int64_t n_running = admit_waiting(&events);
  std::vector<SeqTokens> batch;
  std::vector<Request*> who;
  while (true) {
    collect_batch(&batch, &who);
    if (batch.empty()) return events;
    bool give_up = false;
    if (make_room(batch, &n_running, &events, &give_up)) break;
    if (give_up) return events;
  }
  // The forward.
  int64_t rows = 0;
  for (const SeqTokens& e : batch) {
    rows += e.logits == LogitRows::kAll    ? static_cast<int64_t>(e.tokens.size())
            : e.logits == LogitRows::kLast ? 1
                                           : 0;
  }
  logits_.resize(static_cast<size_t>(std::max<int64_t>(rows, 1) * model_.config().vocab_size));
  last_batch_tokens_ = 0;
  for (const SeqTokens& e : batch) last_batch_tokens_ += static_cast<int64_t>(e.tokens.size());
  try {
    model_.forward(batch, cache_, logits_.data());
  } catch (const Error& e) {
    // (Every input was checked: this is a failure of the machine or the backend. The batch's
    // requests end with it; the others and the generator go on.)
    for (Request* r : who) finish(*r, FinishReason::kError, &events, e.what());
    return events;
  }
  take_logits(batch, who, &events);
  return events;
}

// Admissions, in arrival order, while the blocks and the request limit allow. The blocks the
// decoding requests' next tokens take are kept for them (else a request admitted now would be
// preempted again before it ran).
int64_t Generator::admit_waiting(Events* events) {
  using State = Request::State;
  int64_t n_running = running();
  std::vector<KvCache::Write> decoding;
  for (const auto& r : requests_) {
    if (r->state == State::kDecode) {
      decoding.push_back({r->seq, r->fed, std::span<const int32_t>(&r->tokens.back(), 1)});
    }
  }
  const int64_t reserve = cache_.blocks_needed(decoding);
  for (const auto& r : requests_) {
    if (r->state != State::kWaiting) continue;
    if (options_.max_sequences > 0 && n_running >= options_.max_sequences) break;
    if (!admit(*r, reserve)) {
      if (n_running == 0) {
        finish(*r, FinishReason::kError, events,
               fmt::format("KV cache full: the prompt of {} tokens does not fit in the {} "
                           "positions of the pool",
                           r->tokens.size(), cache_.capacity()));
        continue;
      }
      break;  // back-pressure: it waits for running requests to finish
    }
    ++n_running;
  }
  return n_running;
}

void Generator::collect_batch(std::vector<SeqTokens>* batch, std::vector<Request*>* who) const {
  using State = Request::State;
  batch->clear();
  who->clear();
  int64_t used = 0;
  for (const auto& r : requests_) {
    if (r->state != State::kDecode) continue;
    batch->push_back({r->seq, std::span<const int32_t>(&r->tokens.back(), 1), r->fed,
                      LogitRows::kLast});
    who->push_back(r.get());
    ++used;
  }
  for (const auto& r : requests_) {
    if (r->state != State::kPrefill) continue;
    const int64_t left = static_cast<int64_t>(r->tokens.size()) - r->fed;
    const int64_t chunk = std::min(left, options_.max_batch_tokens - used);
    if (chunk <= 0) break;
    const bool report = r->params.on_prompt_logits && r->fed + chunk > r->reported;
    // (The prompt's end is a checkpoint of a recurrent state: a next turn resumes there.)
    batch->push_back({r->seq, std::span<const int32_t>(r->tokens.data() + r->fed,
                                                       static_cast<size_t>(chunk)),
                      r->fed,
                      report ? LogitRows::kAll
                             : chunk == left ? LogitRows::kLast : LogitRows::kNone,
                      chunk == left});
    who->push_back(r.get());
    used += chunk;
  }
}

bool Generator::make_room(const std::vector<SeqTokens>& batch, int64_t* n_running,
                          Events* events, bool* give_up) {
  using State = Request::State;
  std::vector<KvCache::Write> writes;
  for (const SeqTokens& e : batch) writes.push_back({e.seq, e.pos0, e.tokens});
  while (cache_.blocks_needed(writes) > cache_.blocks_free() && !retained_.empty()) {
    drop_retained();
  }
  if (cache_.blocks_needed(writes) <= cache_.blocks_free()) return true;
  // Preempt the youngest running request (the last admitted in arrival order).
  Request* victim = nullptr;
  for (const auto& r : requests_) {
    if (r->state == State::kPrefill || r->state == State::kDecode) victim = r.get();
  }
  if (*n_running <= 1) {
    finish(*victim, FinishReason::kError, events,
           fmt::format("KV cache full: {} positions do not fit in the {} of the pool",
                       victim->tokens.size(), cache_.capacity()));
    *give_up = true;
    return false;
  }
  cache_.release(victim->seq);
  victim->seq = -1;
  victim->fed = 0;
  victim->state = State::kWaiting;
  --*n_running;
  return false;
}

void Generator::take_logits(const std::vector<SeqTokens>& batch, const std::vector<Request*>& who,
                            Events* events) {
  const int64_t nv = model_.config().vocab_size;
  const float* row = logits_.data();
  for (size_t i = 0; i < batch.size(); ++i) {
    Request& r = *who[i];
    const int64_t n = static_cast<int64_t>(batch[i].tokens.size());
    const int64_t pos0 = r.fed;
    r.fed += n;
    const float* last = nullptr;
    if (batch[i].logits == LogitRows::kAll) {
      // Prompt positions not reported yet (a preempted request's replay reports none twice).
      const int64_t from = std::max(pos0, r.reported);
      const int64_t to = std::min(r.fed, r.prompt);
      if (to > from) r.params.on_prompt_logits(from, row + (from - pos0) * nv, to - from);
      r.reported = std::max(r.reported, to);
      last = row + (n - 1) * nv;
      row += n * nv;
    } else if (batch[i].logits == LogitRows::kLast) {
      last = row;
      row += nv;
    }
    if (last == nullptr || r.fed < static_cast<int64_t>(r.tokens.size())) continue;
    // The prompt (or the last token) is in: the completions sharing the prompt start now, each
    // from a fork of this sequence and its own draw from these logits.
    // (A sampling error -- non-finite logits -- ends that request alone.)
    for (Request* s : r.siblings) {
      if (s->state != Request::State::kSibling) continue;  // (cancelled)
      s->seq = cache_.fork(r.seq);
      s->fed = r.fed;
      s->cached = r.cached;
      try {
        sample(*s, last, events);
      } catch (const Error& e) {
        finish(*s, FinishReason::kError, events, e.what());
      }
    }
    r.siblings.clear();
    if (r.params.max_tokens == 0) {
      finish(r, FinishReason::kLength, events);
      continue;
    }
    try {
      sample(r, last, events);
    } catch (const Error& e) {
      finish(r, FinishReason::kError, events, e.what());
    }
  }
}

}  // namespace tandem
