// `tandem chat`: an interactive conversation on the terminal with the model's own chat template.
// Each turn re-renders the whole conversation; the KV cache keeps the tokens it shares with the
// previous turn (Model::truncate), so only the new part is prefilled. When the conversation no
// longer fits in --ctx, the oldest turns are dropped (the system prompt stays) with a notice.
// Ctrl-C stops the answer being written (what was written stays in the history); /reset starts
// over; /quit or end of input leaves.
#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/chat.h"
#include "engine/sampling.h"
#include "engine/tokenizer.h"
#include "model/model.h"
#include "model/weights.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

std::atomic<bool> g_interrupted{false};

void on_sigint(int) { g_interrupted.store(true); }

struct ChatArgs {
  std::string model;
  std::string system;
  int n_predict = -1;
  int64_t ctx = 4096;
  int threads = 0;
  SamplingParams sampling{0.8f, 40, 0.95f, 0.05f, 0};
  BackendOptions backend;
  std::string cache_type = "f32";
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class ChatSession {
 public:
  ChatSession(const ChatArgs& a, const LoadedModel& lm, ThreadPool& pool, MoeBackend* moe,
              const kern::WeightViews* views)
      : args_(a),
        tok_(lm.gguf ? Tokenizer::from_gguf(*lm.gguf) : Tokenizer::load(a.model)),
        tmpl_(chat_template_for(lm)),
        net_(lm, make_options(a, pool, moe, views)),
        model_(net_, a.ctx, parse_kv_type(a.cache_type)),
        sampler_(a.sampling),
        logits_(static_cast<size_t>(lm.config.vocab_size)) {
    reset();
  }

  void reset() {
    messages_ = jinja::Json::array();
    if (!args_.system.empty()) messages_.push_back({{"role", "system"}, {"content", args_.system}});
    cached_.clear();
    model_.reset();
  }

  // One user turn: prompt, answer streamed to stdout, statistics to stderr.
  void turn(const std::string& user) {
    messages_.push_back({{"role", "user"}, {"content", user}});
    std::vector<TokenId> prompt = fit_prompt();
    if (prompt.empty()) {
      messages_.erase(messages_.end() - 1);
      return;
    }
    // Keep what the cache shares with this prompt; feed the rest (at least one token, for logits).
    size_t keep = 0;
    while (keep < cached_.size() && keep < prompt.size() && cached_[keep] == prompt[keep]) ++keep;
    if (keep == prompt.size()) --keep;
    model_.truncate(static_cast<int64_t>(keep));
    cached_.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(keep));

    const auto t_prefill = std::chrono::steady_clock::now();
    feed(std::vector<TokenId>(prompt.begin() + static_cast<std::ptrdiff_t>(keep), prompt.end()));
    const double prefill_s = seconds_since(t_prefill);
    const size_t prefilled = prompt.size() - keep;

    TokenStreamDecoder text(tok_);  // (a Ctrl-C during the prefill stops before the answer)
    std::string answer;
    int generated = 0;
    const char* stop = "end of answer";
    const auto t_decode = std::chrono::steady_clock::now();
    while (true) {
      if (g_interrupted.load()) {
        stop = "interrupted";
        break;
      }
      const TokenId next = sampler_.sample(logits_.data(), static_cast<int64_t>(logits_.size()));
      if (tok_.is_end_of_generation(next)) break;
      const std::string piece = text.push(next);
      answer += piece;
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
      ++generated;
      if (args_.n_predict >= 0 && generated >= args_.n_predict) {
        stop = "-n reached";
        break;
      }
      if (model_.position() >= model_.ctx()) {
        stop = "context full";
        break;
      }
      feed({next});
    }
    const std::string rest = text.flush();
    answer += rest;
    std::fputs((rest + "\n").c_str(), stdout);
    std::fflush(stdout);
    const double decode_s = seconds_since(t_decode);
    std::fprintf(stderr, "[%s; prefill %zu tokens %.1f tok/s, answer %d tokens %.1f tok/s]\n", stop,
                 prefilled, prefilled / std::max(prefill_s, 1e-9), generated,
                 generated / std::max(decode_s, 1e-9));
    messages_.push_back({{"role", "assistant"}, {"content", answer}});
  }

 private:
  static ModelOptions make_options(const ChatArgs& a, ThreadPool& pool, MoeBackend* moe,
                                   const kern::WeightViews* views) {
    ModelOptions mo;
    mo.moe = moe;
    mo.views = views;
    mo.pool = &pool;
    return mo;
  }

  void feed(const std::vector<TokenId>& ids) {
    if (ids.empty()) return;
    model_.forward(ids, logits_.data(), false);
    cached_.insert(cached_.end(), ids.begin(), ids.end());
  }

  // The rendered conversation, with the oldest turns dropped until it leaves room for an answer
  // (a quarter of the context, or -n). Empty when even the newest message alone does not fit.
  std::vector<TokenId> fit_prompt() {
    const int64_t reserve = args_.n_predict >= 0 ? std::min<int64_t>(args_.n_predict + 1, args_.ctx)
                                                 : args_.ctx / 4;
    const size_t first = messages_.size() > 1 && messages_[0]["role"] == "system" ? 1 : 0;
    int dropped = 0;
    while (true) {
      std::vector<TokenId> ids = render_chat(tmpl_, tok_, messages_, true);
      if (static_cast<int64_t>(ids.size()) + reserve <= args_.ctx) {
        if (dropped) {
          std::fprintf(stderr, "[context full: dropped the %d oldest message%s]\n", dropped,
                       dropped == 1 ? "" : "s");
        }
        return ids;
      }
      if (messages_.size() - first <= 1) {
        std::fprintf(stderr,
                     "[this message is %zu tokens: it does not fit in --ctx %ld with room for an "
                     "answer]\n",
                     ids.size(), static_cast<long>(args_.ctx));
        return {};
      }
      messages_.erase(messages_.begin() + static_cast<std::ptrdiff_t>(first));
      ++dropped;
    }
  }

  const ChatArgs& args_;
  Tokenizer tok_;
  ChatTemplate tmpl_;
  Model net_;
  SingleSequence model_;
  Sampler sampler_;
  std::vector<float> logits_;
  jinja::Json messages_;
  std::vector<TokenId> cached_;  // the tokens whose K/V are in the cache, in order
};

void run_chat(const ChatArgs& a) {
  if (a.ctx < 16) fail(ErrorKind::kInvalidArgument, "--ctx must be at least 16, got {}", a.ctx);
  parse_kv_type(a.cache_type);  // before the load: a bad value fails at once
  const BackendOptions backend = resolve_backend_options(a.backend, a.model);
  const LoadedModel lm = load_model(a.model, load_mode(backend));
  page_in_model(lm);
  ThreadingContext threading(ThreadingOptions{a.threads, true, 50});
  MoeRuntime moe(lm, backend, threading);
  ChatSession session(a, lm, threading.pool(), moe.backend(), moe.weight_views());
  std::fprintf(stderr, "%s\n%s\n%s", model_summary(lm).c_str(), moe.summary().c_str(),
               "chat: /reset starts over, /quit leaves, Ctrl-C stops an answer\n");

  struct sigaction sa = {};
  sa.sa_handler = on_sigint;  // no SA_RESTART: Ctrl-C at the prompt interrupts the read
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);

  std::string line;
  while (true) {
    std::fputs("> ", stderr);
    g_interrupted.store(false);
    if (!std::getline(std::cin, line)) {
      if (g_interrupted.load() && !std::cin.eof()) {  // Ctrl-C at the prompt: a new prompt
        std::cin.clear();
        std::fputs("\n", stderr);
        continue;
      }
      std::fputs("\n", stderr);
      break;
    }
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      session.reset();
      std::fputs("[conversation reset]\n", stderr);
      continue;
    }
    if (line.empty()) continue;
    session.turn(line);
  }
}

void add_chat(CLI::App& app) {
  auto args = std::make_shared<ChatArgs>();
  app.add_option("-m,--model", args->model, "a .gguf file or an HF checkpoint directory")
      ->required();
  app.add_option("-s,--system", args->system, "system prompt");
  app.add_option("-n,--n-predict", args->n_predict, "most tokens per answer (default: no limit)");
  app.add_option("--ctx", args->ctx, "context size in tokens (default 4096)");
  add_threads_option(app, &args->threads);
  add_sampling_options(app, &args->sampling);
  add_backend_options(app, &args->backend);
  add_cache_type_option(app, &args->cache_type);
  app.callback([args] { run_chat(*args); });
}

Registrar reg("chat", "Chat with a model on the terminal, with its own chat template", add_chat);

}  // namespace
}  // namespace tandem::tools
