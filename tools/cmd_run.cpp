// `tandem run`: load a model (GGUF or HF directory), prefill the prompt token ids as one batch,
// then decode one token at a time with the chosen sampler. Generated ids go to stdout as they
// come; the load summary and prefill / decode tokens per second go to stderr. --logits-out
// writes the F32 logits of every prompt position ([n_prompt, n_vocab], raw little-endian).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
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
#include "formats/gguf.h"
#include "formats/output_file.h"
#include "model/model.h"
#include "model/weights.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

struct RunArgs {
  std::string model;
  std::string tokens;
  std::string prompt;
  bool has_tokens = false, has_prompt = false;  // given on the command line (even if empty)
  std::string output;  // "ids" or "text"; default: text for -p, ids for --tokens
  int n_predict = 16;
  SamplingParams sampling;
  int64_t ctx = 0;
  int threads = 0;
  std::string logits_out;
  std::string mla = "auto";
  std::string cache_type = "f32";
  CheckpointOptions checkpoints;  // --checkpoints, --checkpoint-every
  bool ignore_eos = false;
  std::vector<std::string> stop;  // --stop: text that ends the output
  bool chat = false;  // -p is one user message rendered with the model's chat template
  BackendOptions backend;
};

std::vector<int32_t> parse_tokens(const std::string& text, int64_t n_vocab) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size() && !text.empty()) {
    const size_t comma = text.find(',', pos);
    const std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size()) {
      fail(ErrorKind::kInvalidArgument, "--tokens: '{}' is not a token id", item);
    }
    if (v < 0 || v >= n_vocab) {
      fail(ErrorKind::kOutOfRange, "--tokens: token id {} is outside the vocabulary [0, {})", v,
           n_vocab);
    }
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (ids.empty()) fail(ErrorKind::kInvalidArgument, "--tokens: the prompt is empty");
  return ids;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// -o: what is printed ("ids" or "text"), after the arguments are checked.
std::string check_run_args(const RunArgs& a) {
  if (a.n_predict < 0) fail(ErrorKind::kInvalidArgument, "-n must be >= 0, got {}", a.n_predict);
  if (a.ctx < 0) fail(ErrorKind::kInvalidArgument, "--ctx must be >= 0, got {}", a.ctx);
  check_sampling_params(a.sampling);
  if (a.has_tokens == a.has_prompt) {
    fail(ErrorKind::kInvalidArgument, "give the prompt as exactly one of -p TEXT or --tokens IDS");
  }
  const std::string output = a.output.empty() ? (a.has_prompt ? "text" : "ids") : a.output;
  if (output != "ids" && output != "text") {
    fail(ErrorKind::kInvalidArgument, "--output must be 'ids' or 'text', got '{}'", a.output);
  }
  if (a.chat && !a.has_prompt) fail(ErrorKind::kInvalidArgument, "--chat needs -p TEXT");
  return output;
}

// The prompt's token ids: -p (with --chat, the model's chat template around it) or --tokens.
// --chat with a harmony template (gpt-oss) sets *harmony: the answer's channels are parsed, the
// reasoning to stderr, the final answer to stdout.
std::vector<int32_t> prompt_tokens(const RunArgs& a, Engine& engine, const Tokenizer* tokenizer,
                                   bool text_output, std::unique_ptr<ChatStreamParser>* harmony) {
  const ModelConfig& c = engine.config();
  if (a.has_prompt && a.chat) {
    const jinja::Json messages = jinja::Json::array({{{"role", "user"}, {"content", a.prompt}}});
    const ChatTemplate tmpl = chat_template_for(engine.weights());
    if (tool_call_syntax(tmpl.source()) == ToolCallSyntax::kHarmony && text_output) {
      *harmony = std::make_unique<ChatStreamParser>(ToolCallSyntax::kHarmony, false, nullptr);
    }
    return render_chat(tmpl, *tokenizer, messages, true);
  }
  if (!a.has_prompt) return parse_tokens(a.tokens, c.vocab_size);
  std::vector<int32_t> prompt = tokenizer->encode(a.prompt, /*add_special=*/true);
  if (prompt.empty()) fail(ErrorKind::kInvalidArgument, "-p: the prompt is empty");
  check_token_ids(prompt, c.vocab_size, "-p");
  return prompt;
}

// The KV cache's positions: --ctx, or the prompt and -n within what the model was trained for.
int64_t context_size(const RunArgs& a, const ModelConfig& c, size_t prompt) {
  int64_t ctx = a.ctx;
  const bool ctx_given = ctx > 0;
  if (!ctx_given) {
    ctx = static_cast<int64_t>(prompt) + a.n_predict;
    if (c.max_position_embeddings > 0) ctx = std::min<int64_t>(ctx, c.max_position_embeddings);
  }
  if (static_cast<int64_t>(prompt) > ctx) {
    if (ctx_given) {
      fail(ErrorKind::kOutOfRange,
           "the prompt has {} tokens, more than the context size --ctx {}", prompt, ctx);
    }
    fail(ErrorKind::kOutOfRange,
         "the prompt has {} tokens, more than the {} positions the model was trained for",
         prompt, ctx);
  }
  return ctx;
}

// Prints the generation's events as they come: ids, text, or harmony's channels.
class RunOutput {
 public:
  RunOutput(bool text, ChatStreamParser* harmony) : text_(text), harmony_(harmony) {}
  void event(const GenerateEvent& ev) {
    if (harmony_ != nullptr) {
      ChatOutput d;  // (no tools: reasoning and content only)
      d.add(harmony_->push(ev.text));
      print(d);
    } else if (text_) {
      std::fputs(ev.text.c_str(), stdout);
    } else if (ev.token >= 0) {
      std::fprintf(stdout, printed_ == 0 ? "%d" : " %d", ev.token);
    }
    std::fflush(stdout);
    printed_ += ev.token >= 0;
  }
  void end() {
    if (harmony_ != nullptr) {
      ChatOutput rest;
      rest.add(harmony_->finish());
      print(rest);
    }
    std::fprintf(stdout, "\n");
    std::fflush(stdout);
  }

 private:
  static void print(const ChatOutput& o) {
    std::fputs(o.reasoning.c_str(), stderr);
    std::fputs(o.content.c_str(), stdout);
  }
  bool text_;
  ChatStreamParser* harmony_;
  int printed_ = 0;
};

void run_model(const RunArgs& a) {
  const std::string output = check_run_args(a);
  const KvType kv_type = parse_kv_type(a.cache_type);
  EngineOptions eo;
  eo.model = a.model;
  eo.threads = a.threads;
  eo.backend = a.backend;
  eo.mla = parse_mla_mode(a.mla);
  Engine engine(eo);
  const ModelConfig& c = engine.config();
  // The vocabulary: the GGUF metadata, or an HF directory's tokenizer.model / tokenizer.json.
  const Tokenizer* tokenizer = nullptr;
  if (a.has_prompt || output == "text" || !a.stop.empty()) tokenizer = &engine.tokenizer();
  std::unique_ptr<ChatStreamParser> harmony;
  const std::vector<int32_t> prompt =
      prompt_tokens(a, engine, tokenizer, output == "text", &harmony);
  std::string prompt_ids;
  for (int32_t id : prompt) prompt_ids += fmt::format("{}{}", prompt_ids.empty() ? "" : ",", id);
  std::fprintf(stderr, "prompt: %zu tokens: %s\n", prompt.size(), prompt_ids.c_str());
  const int64_t ctx = context_size(a, c, prompt.size());
  KvCache cache = engine.make_cache(ctx, kv_type, 1, a.checkpoints);
  std::fprintf(stderr, "%s\n", engine.summary().c_str());
  std::fprintf(stderr, "loaded in %.2f s; KV cache %.1f MiB (%s) for %ld positions; %d threads\n",
               engine.load_seconds(), cache.bytes() / 1048576.0, a.cache_type.c_str(),
               static_cast<long>(ctx), engine.threading().n_threads());

  // One request; the whole prompt in one forward (a batch of its size), as a prefill.
  GeneratorOptions go;
  go.max_batch_tokens = static_cast<int64_t>(prompt.size());
  go.reuse_prefix = false;
  Generator gen(engine.model(), cache, tokenizer, go);
  GenerateParams gp;
  gp.sampling = a.sampling;
  gp.max_tokens = a.n_predict;
  gp.ignore_eos = a.ignore_eos;
  gp.stop = a.stop;
  gp.continues_prompt = !a.chat;  // --chat: the answer alone
  gp.special_text = harmony != nullptr;
  std::unique_ptr<OutputFile> logits_out;  // (checked writes; in place once complete)
  if (!a.logits_out.empty()) {
    logits_out = std::make_unique<OutputFile>(a.logits_out);
    const int64_t nv = c.vocab_size;
    gp.on_prompt_logits = [&logits_out, nv](int64_t, const float* rows, int64_t n) {
      logits_out->write(rows, static_cast<size_t>(n * nv) * sizeof(float));
    };
  }
  if (output == "text" && a.has_prompt && !a.chat) {
    std::fputs(a.prompt.c_str(), stdout);  // like llama.cpp: the prompt, then the continuation
  }
  RunOutput out(output == "text", harmony.get());
  gen.submit(prompt, gp);
  const auto t_prefill = std::chrono::steady_clock::now();
  double prefill_s = 0;
  auto t_decode = t_prefill;
  int steps = 0;
  FinishReason finish = FinishReason::kNone;
  while (finish == FinishReason::kNone && !gen.idle()) {
    const std::vector<GenerateEvent> events = gen.step();
    if (steps++ == 0) {
      prefill_s = seconds_since(t_prefill);
      t_decode = std::chrono::steady_clock::now();
    }
    for (const GenerateEvent& ev : events) {
      if (ev.finish == FinishReason::kError) fail(ErrorKind::kResource, "{}", ev.error);
      out.event(ev);
      finish = ev.finish;
    }
  }
  out.end();
  if (logits_out) logits_out->commit();
  if (finish == FinishReason::kContext) {
    std::fprintf(stderr, "context full (--ctx %ld): stopping\n", static_cast<long>(ctx));
  }
  const double decode_s = seconds_since(t_decode);
  const int decoded = std::max(0, steps - 1);
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", prompt.size(),
               prefill_s, prompt.size() / std::max(prefill_s, 1e-9));
  std::fprintf(stderr, "decode: %d tokens in %.3f s (%.1f tokens/s)\n", decoded, decode_s,
               decoded / std::max(decode_s, 1e-9));
}

void add_run(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  app.add_option("-m,--model", args->model, "a .gguf file or an HF checkpoint directory")
      ->required();
  CLI::Option* tokens =
      app.add_option("--tokens", args->tokens, "prompt token ids, comma-separated (BOS included)");
  CLI::Option* prompt = app.add_option("-p,--prompt", args->prompt,
                                       "prompt text (GGUF vocabulary; BOS added as the "
                                       "metadata asks)");
  app.add_option("--output", args->output,
                 "print generated 'ids' or 'text' (default: text for "
                 "-p, ids for --tokens)");
  app.add_option("-n,--n-predict", args->n_predict, "tokens to generate (default 16)");
  add_sampling_options(app, &args->sampling);
  app.add_option("--ctx", args->ctx, "KV cache positions (default: prompt + n)");
  add_threads_option(app, &args->threads);
  app.add_option("--logits-out", args->logits_out, "write F32 logits of every prompt position");
  add_mla_option(app, &args->mla);
  add_cache_type_option(app, &args->cache_type);
  add_checkpoint_options(app, &args->checkpoints);
  add_backend_options(app, &args->backend);
  app.add_flag("--ignore-eos", args->ignore_eos, "keep generating after the EOS token");
  app.add_option("--stop", args->stop, "stop before this text (repeatable; needs a vocabulary)");
  app.add_flag("--chat", args->chat,
               "-p is a user message: apply the model's chat template, print only the answer");
  app.callback([args, tokens, prompt] {
    args->has_tokens = tokens->count() > 0;
    args->has_prompt = prompt->count() > 0;
    run_model(*args);
  });
}

Registrar reg("run", "Generate tokens: prefill the prompt, then decode",
              add_run);

}  // namespace
}  // namespace tandem::tools
