// The generation loop every front-end shares (run, chat, perplexity, bench --batch, the server,
// the Python engine): requests -- a prompt, its sampling and its stop conditions -- become
// sequences of a KvCache, and each step() is one Model::forward over all of them: one decode token
// of each decoding sequence, then prompt chunks of the others up to a token budget (chunked
// prefill, so a long prompt does not stall the others' decoding). Each sequence then samples its
// next token with its own sampler and the token becomes text, held back while it may still turn
// into a stop string.
//
// The KV cache's blocks are the scarce resource. A request is admitted when its prompt fits in
// the free blocks; when the running sequences' next tokens do not fit, the youngest is preempted
// (its blocks released, its tokens prefilled again later: vLLM's recompute preemption) and
// finished sequences kept for their prefix are released first. A request that cannot fit even
// alone ends with an error, never by taking blocks from another. A new prompt continues from the
// longest prefix a live or kept sequence holds (its blocks shared, copied on write), so a chat's
// next turn and n > 1 completions prefill only what is new.
//
// Not thread-safe: one thread submits, steps and cancels (a server's scheduler thread).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/sampling.h"
#include "engine/tokenizer.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace tandem {

using RequestId = int64_t;

enum class FinishReason {
  kNone,       // still running
  kStop,       // end of generation, a stop token or a stop string
  kLength,     // max_tokens reached (or 0 asked for: the prompt only)
  kContext,    // the sequence reached the context size
  kCancelled,  // cancel()
  kError,      // it cannot run: GenerateEvent::error says why
};
// "stop" | "length" | "context" | "cancelled" | "error" (OpenAI's words where it has them).
const char* finish_reason_name(FinishReason reason);

struct GenerateParams {
  SamplingParams sampling;
  int64_t max_tokens = -1;           // -1: until a stop or the context's end; 0: the prompt only
  std::vector<std::string> stop;     // text that ends the output (not part of it)
  std::vector<int32_t> stop_tokens;  // tokens that end it, besides end-of-generation ones
  bool ignore_eos = false;           // end-of-generation tokens are ordinary tokens
  int top_logprobs = -1;             // >= 0: each token's log-probability and the top ones
  // The text continues the prompt's (a completion: a SentencePiece piece keeps the space it
  // starts with after the prompt), or stands alone (an answer: decoded as the generated tokens
  // alone are, as Hugging Face's decode gives them).
  bool continues_prompt = true;
  // Control tokens (a template's tool-call markers, for one) written as their text, not dropped.
  bool special_text = false;
  // Called with the logits of prompt positions as they are computed: (first position, rows
  // [n, vocab], n). Each position once, in order. (perplexity, run --logits-out)
  std::function<void(int64_t, const float*, int64_t)> on_prompt_logits;
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
};

// What one step produced for one request.
struct GenerateEvent {
  RequestId id = -1;
  int32_t token = -1;  // the token sampled in this step (-1: none)
  std::string text;    // text that became final in this step
  float logprob = 0;   // the token's log-probability under the model (top_logprobs >= 0)
  std::vector<TokenLogprob> top_logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string error;  // kError: why
  std::string stop;   // kStop by a stop string: that string
};

struct GeneratorOptions {
  // Tokens per forward: every decoding sequence's token, then prompt chunks up to this many.
  int64_t max_batch_tokens = 512;
  int max_sequences = 0;     // requests running at once (0: as many as the cache holds)
  bool reuse_prefix = true;  // a prompt continues from the longest prefix a sequence holds
  int retain = 4;            // finished sequences kept for their prefix (the oldest go first)
};

class Generator {
 public:
  // tokenizer: nullptr for token ids only (no text; end of generation is the config's EOS id).
  Generator(Model& model, KvCache& cache, const Tokenizer* tokenizer,
            const GeneratorOptions& options = {});
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Queues a request; n > 1 queues n completions of one prompt (ids id .. id + n - 1, completion
  // i seeded with seed + i) that share its prefill. Throws Error(kInvalidArgument) for an empty
  // prompt, a token outside the vocabulary or bad sampling values, Error(kOutOfRange) naming
  // the context size when the prompt does not fit in it.
  RequestId submit(std::vector<int32_t> prompt, GenerateParams params, int n = 1);
  // Ends a queued or running request at the next step (an event with kCancelled).
  void cancel(RequestId id);
  // One forward over the running requests (admitting queued ones first): the events of the
  // requests that sampled a token or finished. Nothing to do: no events.
  std::vector<GenerateEvent> step();

  bool idle() const { return running() == 0 && waiting() == 0; }
  int64_t waiting() const;
  int64_t running() const;
  // Tokens of a request so far: its prompt, and of those how many came from a kept prefix; the
  // tokens it generated. (A finished request's until the next step().)
  struct Usage {
    int64_t prompt = 0, cached = 0, generated = 0;
  };
  Usage usage(RequestId id) const;
  const std::vector<int32_t>& tokens(RequestId id) const;  // prompt, then generated
  // Releases the sequences kept for their prefix.
  void clear_retained();
  // Tokens per forward from the next step on (a server keeps decode steps within a latency
  // target by shrinking the prompt chunks). Error(kInvalidArgument) below 1.
  void set_max_batch_tokens(int64_t tokens);
  int64_t max_batch_tokens() const { return options_.max_batch_tokens; }
  // The forward's logits rows of the last step (tests).
  int64_t last_batch_tokens() const { return last_batch_tokens_; }

 private:
  struct Request;
  Request* find(RequestId id) const;
  // reserve: free blocks that must stay free (the decoding requests' next tokens).
  bool admit(Request& r, int64_t reserve);
  void finish(Request& r, FinishReason reason, std::vector<GenerateEvent>* events,
              std::string error = {});
  // r is done: its sequence kept for its prefix (keep_prefix) or released.
  void retire(Request& r, bool keep_prefix);
  void sample(Request& r, const float* row, std::vector<GenerateEvent>* events);
  void emit_text(Request& r, GenerateEvent& ev, bool at_end);
  bool is_end(const Request& r, int32_t token) const;
  void drop_retained();  // releases the oldest kept sequence

  // step()'s parts, in order.
  using Events = std::vector<GenerateEvent>;
  // Requests admitted while the blocks and the request limit allow; the running count after.
  int64_t admit_waiting(Events* events);
  // Every decoding request's token, then prompt chunks up to the token budget.
  void collect_batch(std::vector<SeqTokens>* batch, std::vector<Request*>* who) const;
  // Blocks for the batch: kept prefixes dropped, then the youngest running request preempted
  // (false: the batch must be made again; a lone request that cannot fit ends with an error).
  bool make_room(const std::vector<SeqTokens>& batch, int64_t* n_running, Events* events,
                 bool* give_up);
  // The batch's logits: prompt rows reported, sibling completions forked, next tokens sampled.
  void take_logits(const std::vector<SeqTokens>& batch, const std::vector<Request*>& who,
                   Events* events);

  Model& model_;
  KvCache& cache_;
  const Tokenizer* tokenizer_;
  GeneratorOptions options_;
  RequestId next_id_ = 0;
  std::vector<std::unique_ptr<Request>> requests_;  // in arrival order
  std::deque<SeqId> retained_;
  std::vector<float> logits_;
  int64_t last_batch_tokens_ = 0;
};

}  // namespace tandem
