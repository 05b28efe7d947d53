// `tandem serve`: an OpenAI-compatible HTTP server (docs/server.md). It binds first and answers
// /health with 503 while the model loads; then requests are batched continuously by the
// scheduler (server/scheduler.h) over one paged KV cache of --parallel sequences of --ctx
// positions each. SIGINT / SIGTERM stop it.
#include <fmt/format.h>
#include <malloc.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"
#include "engine/chat.h"
#include "engine/chat_output.h"
#include "engine/engine.h"
#include "server/http_server.h"
#include "server/scheduler.h"
#include "tools/command.h"
#include "tools/timeline_file.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

std::atomic<bool> g_stop{false};

void on_signal(int) {
  g_stop = true;
}

struct ServeArgs {
  std::string model;
  std::string alias;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  int parallel = 4;
  int64_t ctx = 0;
  int64_t queue = 256;
  int64_t batch_tokens = 512;
  double tpot_target_ms = 0;
  int prefix_cache = 16;
  int64_t max_body = 8 << 20;
  int http_threads = 0;
  int timeout_s = 60;
  bool no_webui = false;
  std::string timeline;  // --timeline FILE: written when the server stops
  std::string chat_template;
  int threads = 0;
  std::string mla = "auto";
  std::string cache_type = "f32";
  CheckpointOptions checkpoints;  // --checkpoints, --checkpoint-every
  SamplingParams sampling;
  BackendOptions backend;
};

void serve(const ServeArgs& a) {
  // glibc gives each thread that allocates an arena of its own (up to 8 per core) and keeps
  // their freed memory: HTTP threads parsing multi-megabyte requests grew the server by hundreds
  // of MiB. Two arenas (and a trim after each large request, server/http_connection.cpp) keep
  // it flat (docs/hostile-input.md); the serving threads allocate little besides requests.
  mallopt(M_ARENA_MAX, 2);
  if (a.parallel < 1)
    fail(ErrorKind::kInvalidArgument, "--parallel must be >= 1, got {}", a.parallel);
  if (a.ctx < 0) fail(ErrorKind::kInvalidArgument, "--ctx must be >= 0, got {}", a.ctx);
  if (a.batch_tokens < 1) {
    fail(ErrorKind::kInvalidArgument, "--batch-tokens must be >= 1, got {}", a.batch_tokens);
  }
  check_sampling_params(a.sampling);
  const KvType kv_type = parse_kv_type(a.cache_type);
  std::string api_key = a.api_key;
  if (api_key.empty()) {
    if (const char* env = std::getenv("TANDEM_API_KEY")) api_key = env;
  }
  std::optional<ChatTemplate> override_template;
  if (!a.chat_template.empty()) {
    // Named without the server's directories: a template's errors reach the clients.
    override_template.emplace(
        read_input_file(a.chat_template, kMaxConfigFileBytes, "--chat-template"),
        std::filesystem::path(a.chat_template).filename().string());
  }

  TimelineFile timeline_file(a.timeline);  // (a path that cannot be written fails here)
  server::HttpOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.api_key = api_key;
  ho.max_body = static_cast<size_t>(a.max_body);
  ho.timeout_s = a.timeout_s;
  ho.webui = !a.no_webui;
  // Every running and queued request holds a connection; a few more answer /health, /metrics.
  ho.threads = a.http_threads > 0
                   ? a.http_threads
                   : static_cast<int>(std::min<int64_t>(a.parallel + a.queue + 8, 1024));
  server::HttpServer http(ho);
  http.start();
  std::fprintf(stderr, "listening on http://%s:%d\n", a.host.c_str(), http.port());
  std::fflush(stderr);
  if (a.host != "127.0.0.1" && a.host != "localhost" && a.host != "::1" && api_key.empty()) {
    log_warn("serving on {} without --api-key: anyone who reaches this address may use it", a.host);
  }

  EngineOptions eo;
  eo.model = a.model;
  eo.threads = a.threads;
  eo.backend = a.backend;
  eo.mla = parse_mla_mode(a.mla);
  Engine engine(eo);
  const Tokenizer& tok = engine.tokenizer();
  KvCache cache = engine.make_cache(a.ctx, kv_type, a.parallel, a.checkpoints);
  std::optional<ChatTemplate> model_template;
  const ChatTemplate* tmpl = nullptr;
  if (override_template) {
    tmpl = &*override_template;
  } else {
    try {
      model_template.emplace(chat_template_for(engine.weights()).source(),
                             "the model's chat template");
      tmpl = &*model_template;
    } catch (const Error& e) {
      log_warn("{}: /v1/chat/completions answers 400 (give --chat-template FILE)", e.what());
    }
  }

  server::ModelInfo info;
  info.name = !a.alias.empty() ? a.alias : engine.weights().path.filename().string();
  info.vocab_size = engine.config().vocab_size;
  info.context = engine.context_size(a.ctx);
  info.tokenizer = &tok;
  info.chat_template = tmpl;
  info.tool_syntax = tmpl != nullptr ? tool_call_syntax(tmpl->source()) : ToolCallSyntax::kNone;
  info.defaults = a.sampling;

  server::SchedulerOptions so;
  so.parallel = a.parallel;
  so.queue = a.queue;
  so.max_batch_tokens = a.batch_tokens;
  so.tpot_target_ms = a.tpot_target_ms;
  so.retain = a.prefix_cache;
  server::Scheduler scheduler(engine.model(), cache, &tok, so, http.metrics(), &engine.moe());
  std::fprintf(stderr, "%s\n", engine.summary().c_str());
  std::fprintf(stderr,
               "model '%s' ready in %.2f s: %d sequences of %ld positions, KV cache %.1f MiB "
               "(%s); tool calls: %s\n",
               info.name.c_str(), engine.load_seconds(), a.parallel,
               static_cast<long>(info.context), cache.bytes() / 1048576.0, a.cache_type.c_str(),
               tool_call_syntax_name(info.tool_syntax));
  std::fflush(stderr);

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  http.ready(&info, &scheduler);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::fprintf(stderr, "stopping\n");
  http.stop();  // (before the scheduler and the model go)
  timeline_file.finish();
}

void add_serve(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  app.add_option("-m,--model", args->model, "a .gguf file or an HF checkpoint directory")
      ->required();
  app.add_option("--alias", args->alias, "the model's id in the API (default: the file name)");
  app.add_option("--host", args->host,
                 "address to listen on (another than 127.0.0.1 exposes "
                 "the server: give --api-key)")
      ->capture_default_str();
  app.add_option("--port", args->port, "TCP port (0: any free one, printed)")
      ->check(number_in(0, 65535))
      ->capture_default_str();
  app.add_option("--api-key", args->api_key,
                 "require 'Authorization: Bearer KEY' on every endpoint but /health (default: "
                 "$TANDEM_API_KEY)");
  app.add_option("--parallel", args->parallel, "sequences decoded together")
      ->check(number_in(1, 4096))
      ->capture_default_str();
  app.add_option("--ctx", args->ctx,
                 "context size of each sequence (default: 4096, or the model's when shorter); "
                 "the KV pool holds --parallel of them")
      ->check(number_in(0));
  app.add_option("--queue", args->queue, "requests waiting for a sequence at most (more: 429)")
      ->check(number_in(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--batch-tokens", args->batch_tokens,
                 "tokens per forward at most (decode tokens, then prompt chunks)")
      ->check(number_in(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--tpot-target-ms", args->tpot_target_ms,
                 "time per output token to keep decode steps under: prompt chunks shrink while "
                 "steps run longer (0: no target)")
      ->check(number_in(0, 1e6))
      ->capture_default_str();
  app.add_option("--prefix-cache", args->prefix_cache,
                 "finished sequences kept for their prompt prefix (a chat's next turn re-uses "
                 "their KV blocks; dropped first when blocks run out)")
      ->check(number_in(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-body", args->max_body, "request body bytes at most (more: 413)")
      ->check(number_in(1024, int64_t{1} << 32))
      ->capture_default_str();
  app.add_option("--http-threads", args->http_threads,
                 "connections served at once, as many more waiting, the rest answered 503 "
                 "(default: --parallel + --queue + 8)")
      ->check(number_in(0, 65536));
  app.add_option("--timeout", args->timeout_s,
                 "seconds a client has to send one request's headers and body (then 408)")
      ->check(number_in(1, 86400))
      ->capture_default_str();
  app.add_flag("--no-webui", args->no_webui, "do not serve the chat page at /");
  add_timeline_option(app, &args->timeline,
                      "the steps served, when the server stops (the first 4 M spans),");
  app.add_option("--chat-template", args->chat_template,
                 "a Jinja chat template file to use instead of the model's");
  add_threads_option(app, &args->threads);
  add_mla_option(app, &args->mla);
  add_cache_type_option(app, &args->cache_type);
  add_checkpoint_options(app, &args->checkpoints);
  add_sampling_options(app, &args->sampling);
  add_backend_options(app, &args->backend);
  app.callback([args] { serve(*args); });
}

Registrar reg("serve", "Serve the model over an OpenAI-compatible HTTP API", add_serve);

}  // namespace
}  // namespace tandem::tools
