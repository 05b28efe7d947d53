// `tandem chat`: an interactive conversation on the terminal with the model's own chat template.
// Each turn re-renders the whole conversation; the generator keeps the previous turn's sequence
// and continues from the prefix it shares with the new prompt, so only the new part is prefilled. When the conversation no
// longer fits in --ctx, the oldest turns are dropped (the system prompt stays) with a notice.
// Ctrl-C stops the answer being written (what was written stays in the history); /reset starts
// over; /quit or end of input leaves.
#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/chat.h"
#include "engine/chat_output.h"
#include "engine/engine.h"
#include "engine/generator.h"
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

// llama.cpp's chat defaults.
SamplingParams chat_sampling() {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.min_p = 0.05f;
  return p;
}

struct ChatArgs {
  std::string model;
  std::string system;
  int n_predict = -1;
  int64_t ctx = 4096;
  int threads = 0;
  SamplingParams sampling = chat_sampling();
  BackendOptions backend;
  std::string cache_type = "f32";
  CheckpointOptions checkpoints;  // --checkpoints, --checkpoint-every
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class ChatSession {
 public:
  ChatSession(const ChatArgs& a, Engine& engine)
      : args_(a),
        engine_(engine),
        tmpl_(chat_template_for(engine.weights())),
        cache_(engine.make_cache(a.ctx, parse_kv_type(a.cache_type), 1, a.checkpoints)),
        gen_(engine.model(), cache_, &engine.tokenizer(), options()) {
    reset();
  }

  void reset() {
    messages_ = jinja::Json::array();
    if (!args_.system.empty()) messages_.push_back({{"role", "system"}, {"content", args_.system}});
    gen_.clear_retained();
  }

  // One user turn: prompt, answer streamed to stdout, statistics to stderr. The generator keeps
  // the previous turn's sequence: only what the rendered conversation adds is prefilled.
  void turn(const std::string& user) {
    messages_.push_back({{"role", "user"}, {"content", user}});
    std::vector<TokenId> prompt = fit_prompt();
    if (prompt.empty()) {
      messages_.erase(messages_.end() - 1);
      return;
    }
    GenerateParams p;
    p.sampling = args_.sampling;
    p.sampling.seed = args_.sampling.seed + turns_++;
    p.max_tokens = args_.n_predict;
    p.continues_prompt = false;
    // gpt-oss answers in harmony messages: its channels (control tokens) are parsed, the
    // reasoning (analysis) goes to stderr, the final answer to stdout and into the history.
    std::unique_ptr<ChatStreamParser> harmony;
    if (tool_call_syntax(tmpl_.source()) == ToolCallSyntax::kHarmony) {
      p.special_text = true;
      harmony = std::make_unique<ChatStreamParser>(ToolCallSyntax::kHarmony, false, nullptr);
    }
    auto show = [&](const std::string& reasoning, const std::string& content) {
      if (!reasoning.empty()) std::fputs(reasoning.c_str(), stderr);
      std::fputs(content.c_str(), stdout);
      std::fflush(stdout);
    };
    const RequestId id = gen_.submit(prompt, p);
    std::string answer;
    const char* stop = "end of answer";
    const auto t_prefill = std::chrono::steady_clock::now();
    auto t_decode = t_prefill;
    double prefill_s = 0;
    int generated = 0, steps = 0;
    int64_t prefilled = 0;
    while (!gen_.idle()) {
      if (g_interrupted.load()) gen_.cancel(id);
      const std::vector<GenerateEvent> events = gen_.step();
      if (steps++ == 0) {
        prefill_s = seconds_since(t_prefill);
        t_decode = std::chrono::steady_clock::now();
        const Generator::Usage u = gen_.usage(id);
        prefilled = u.prompt - u.cached;
      }
      for (const GenerateEvent& ev : events) {
        if (harmony != nullptr) {
          ChatOutput d;  // (no tools: reasoning and content only)
          d.add(harmony->push(ev.text));
          answer += d.content;
          show(d.reasoning, d.content);
        } else {
          answer += ev.text;
          show("", ev.text);
        }
        if (ev.token >= 0 && ev.finish != FinishReason::kStop) ++generated;
        switch (ev.finish) {
          case FinishReason::kLength: stop = "-n reached"; break;
          case FinishReason::kContext: stop = "context full"; break;
          case FinishReason::kCancelled: stop = "interrupted"; break;
          case FinishReason::kError:
            stop = "error";
            std::fprintf(stderr, "\n%s", ev.error.c_str());
            break;
          default: break;
        }
      }
    }
    if (harmony != nullptr) {
      ChatOutput rest;
      rest.add(harmony->finish());
      answer += rest.content;
      show(rest.reasoning, rest.content);
    }
    std::fputs("\n", stdout);
    std::fflush(stdout);
    const double decode_s = seconds_since(t_decode);
    std::fprintf(stderr, "[%s; prefill %ld tokens %.1f tok/s, answer %d tokens %.1f tok/s]\n",
                 stop, static_cast<long>(prefilled), prefilled / std::max(prefill_s, 1e-9),
                 generated, generated / std::max(decode_s, 1e-9));
    messages_.push_back({{"role", "assistant"}, {"content", answer}});
  }

 private:
  GeneratorOptions options() const {
    GeneratorOptions o;
    o.max_batch_tokens = args_.ctx;  // a turn's new part in one forward
    o.retain = 1;
    return o;
  }

  // The rendered conversation, with the oldest turns dropped until it leaves room for an answer
  // (a quarter of the context, or -n). Empty when even the newest message alone does not fit.
  std::vector<TokenId> fit_prompt() {
    const int64_t reserve = args_.n_predict >= 0 ? std::min<int64_t>(args_.n_predict + 1, args_.ctx)
                                                 : args_.ctx / 4;
    const size_t first = messages_.size() > 1 && messages_[0]["role"] == "system" ? 1 : 0;
    int dropped = 0;
    while (true) {
      std::vector<TokenId> ids = render_chat(tmpl_, engine_.tokenizer(), messages_, true);
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
  Engine& engine_;
  ChatTemplate tmpl_;
  KvCache cache_;
  Generator gen_;
  jinja::Json messages_;
  uint64_t turns_ = 0;
};

void run_chat(const ChatArgs& a) {
  if (a.ctx < 16) fail(ErrorKind::kInvalidArgument, "--ctx must be at least 16, got {}", a.ctx);
  parse_kv_type(a.cache_type);  // before the load: a bad value fails at once
  check_sampling_params(a.sampling);
  EngineOptions eo;
  eo.model = a.model;
  eo.threads = a.threads;
  eo.backend = a.backend;
  Engine engine(eo);
  ChatSession session(a, engine);
  std::fprintf(stderr, "%s\n%s", engine.summary().c_str(),
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
  add_checkpoint_options(app, &args->checkpoints);
  app.callback([args] { run_chat(*args); });
}

Registrar reg("chat", "Chat with a model on the terminal, with its own chat template", add_chat);

}  // namespace
}  // namespace tandem::tools
