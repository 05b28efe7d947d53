#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <ctime>

namespace tandem::server {
namespace {

constexpr int kMaxJsonDepth = 64;

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429) res.set_header("Retry-After", "1");
  res.set_content(error_body(e), "application/json");
}

Json parse_body(const httplib::Request& req) {
  // Deeper nesting than any request needs is refused before parsing (copies and dumps of JSON
  // values recurse).
  if (jinja::json_nesting(req.body).max_depth > kMaxJsonDepth) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("the request body nests deeper than {} levels", kMaxJsonDepth));
  }
  Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    throw ApiError(400, "invalid_request_error", "the request body is not valid JSON");
  }
  return body;
}

std::string status_message(const httplib::Request& req, int status, const HttpOptions& options) {
  switch (status) {
    case 404:
      return fmt::format("no route {} {}", req.method, req.path);
    case 405:
      return fmt::format("{} is not allowed on {}", req.method, req.path);
    case 413:
      return fmt::format(
          "the request body is larger than the server's limit of {} bytes "
          "(--max-body)",
          options.max_body);
    case 414:
      return "the request line is too long";
    default:
      return fmt::format("HTTP {}", status);
  }
}

// cpp-httplib 0.11 (Debian 12's) listens with a backlog of 5 connections: a burst of clients
// (64 streams opened at once) overflows it and the kernel drops their handshakes. Listening
// again on the bound socket raises the backlog.
class Server : public httplib::Server {
 public:
  void raise_backlog(int n) { ::listen(svr_sock_, n); }
};

// What one completion request holds while its response is written.
struct Exchange {
  ApiRequest request;
  std::shared_ptr<Job> job;
  std::unique_ptr<ResponseBuilder> builder;
  bool started = false;
};

}  // namespace

HttpServer::HttpServer(const HttpOptions& options)
    : options_(options), http_(std::make_unique<Server>()) {
  if (options_.threads < 1) {
    fail(ErrorKind::kInvalidArgument, "--http-threads must be >= 1, got {}", options_.threads);
  }
  if (options_.port < 0 || options_.port > 65535) {
    fail(ErrorKind::kInvalidArgument, "--port must be in [0, 65535], got {}", options_.port);
  }
  routes();
}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::start() {
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    if (port_ < 0) {
      fail(ErrorKind::kIo, "cannot listen on {} (any port)", options_.host);
    }
  } else {
    if (!http_->bind_to_port(options_.host, options_.port)) {
      fail(ErrorKind::kIo, "cannot listen on {}:{} (in use, or not an address of this machine)",
           options_.host, options_.port);
    }
    port_ = options_.port;
  }
  static_cast<Server*>(http_.get())->raise_backlog(SOMAXCONN);
  thread_ = std::thread([this] { http_->listen_after_bind(); });
}

void HttpServer::ready(const ModelInfo* model, Scheduler* scheduler) {
  scheduler_.store(scheduler);
  model_.store(model);
}

void HttpServer::stop() {
  if (!thread_.joinable()) return;
  http_->stop();
  thread_.join();
}

void HttpServer::routes() {
  using httplib::Request;
  using httplib::Response;
  httplib::Server& s = *http_;
  const int threads = options_.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.set_payload_max_length(options_.max_body);
  s.set_pre_routing_handler([this](const Request& req, Response& res) {
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (!options_.api_key.empty() &&
        req.get_header_value("Authorization") != "Bearer " + options_.api_key) {
      send_error(res, ApiError(401, "authentication_error",
                               "a valid API key is needed: 'Authorization: Bearer KEY'"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (model_.load() == nullptr && req.path != "/metrics") {
      send_error(res, ApiError(503, "unavailable_error", "the model is loading"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([this](const Request& req, Response& res) {
        if (res.body.empty() && !res.is_chunked_content_provider_) {
          const std::string type = res.status >= 500 ? "server_error" : "invalid_request_error";
          res.set_content(
              error_body(ApiError(res.status, type, status_message(req, res.status, options_))),
              "application/json");
        }
        return httplib::Server::HandlerResponse::Handled;
      }));
  s.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, "server_error", what));
  });
  s.set_logger([this](const Request&, const Response& res) { metrics_.http_response(res.status); });

  // Runs `f`, answering what it throws in OpenAI's error shape.
  const auto guarded = [](auto f) {
    return [f](const Request& req, Response& res) {
      try {
        f(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const Error& e) {
        send_error(res, api_error(e));
      }
    };
  };

  s.Get("/health", [this](const Request&, Response& res) {
    if (model_.load() == nullptr) {
      res.status = 503;
      res.set_content(R"({"status":"loading"})", "application/json");
    } else {
      res.set_content(R"({"status":"ok"})", "application/json");
    }
  });
  const auto models = guarded([this](const Request&, Response& res) {
    const ModelInfo& m = *model_.load();
    Json data = Json::array({{{"id", m.name},
                              {"object", "model"},
                              {"created", static_cast<int64_t>(std::time(nullptr))},
                              {"owned_by", "tandem"},
                              {"context_length", m.context}}});
    res.set_content(dump_json(Json({{"object", "list"}, {"data", data}})), "application/json");
  });
  s.Get("/v1/models", models);
  s.Get("/models", models);
  s.Get("/metrics", [this](const Request&, Response& res) {
    res.set_content(metrics_.render(), "text/plain; version=0.0.4");
  });
  s.Post("/tokenize", guarded([this](const Request& req, Response& res) {
           const ModelInfo& m = *model_.load();
           const Json body = parse_body(req);
           if (!body.is_object() || !body.contains("content") || !body["content"].is_string()) {
             bad_request("content", "'content' must be a string");
           }
           const bool add_special = body.value("add_special", false);
           const bool with_pieces = body.value("with_pieces", false);
           const std::vector<int32_t> ids =
               m.tokenizer->encode(body["content"].get<std::string>(), add_special);
           Json tokens = Json::array();
           for (int32_t id : ids) {
             if (with_pieces) {
               tokens.push_back({{"id", id}, {"piece", m.tokenizer->token_to_piece(id, true)}});
             } else {
               tokens.push_back(id);
             }
           }
           res.set_content(dump_json(Json({{"tokens", tokens}})), "application/json");
         }));
  s.Post(
      "/detokenize", guarded([this](const Request& req, Response& res) {
        const ModelInfo& m = *model_.load();
        const Json body = parse_body(req);
        if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array()) {
          bad_request("tokens", "'tokens' must be an array of token ids");
        }
        std::vector<int32_t> ids;
        for (const Json& t : body["tokens"]) {
          if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= m.vocab_size) {
            bad_request("tokens",
                        fmt::format("{} is not a token id in [0, {})", t.dump(), m.vocab_size));
          }
          ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
        res.set_content(dump_json(Json({{"content", m.tokenizer->decode(ids)}})),
                        "application/json");
      }));

  const auto completion = [this, guarded](bool chat) {
    return guarded([this, chat](const Request& req, Response& res) {
      const ModelInfo& m = *model_.load();
      Scheduler& sched = *scheduler_.load();
      const Json body = parse_body(req);
      auto x = std::make_shared<Exchange>();
      x->request = chat ? parse_chat_request(body, m) : parse_completion_request(body, m);
      x->job = sched.submit(x->request.prompt, x->request.params, x->request.n);
      Error refused(ErrorKind::kInternal, "");
      if (!x->job->wait_accepted(&refused)) throw api_error(refused);
      const uint64_t serial = next_id_.fetch_add(1);
      x->builder = std::make_unique<ResponseBuilder>(
          x->request, m, fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", serial),
          static_cast<int64_t>(std::time(nullptr)));
      // A client that goes away cancels its completions (their blocks are freed at the next
      // step).
      Scheduler* sp = &sched;
      const auto release = [sp, x](bool success) {
        if (!success && !x->job->done()) sp->cancel(x->job);
      };
      if (x->request.stream) {
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider(
            "text/event-stream",
            [x](size_t, httplib::DataSink& sink) {
              std::string out;
              if (!x->started) {
                out = x->builder->stream_start();
                x->started = true;
              }
              for (const Job::Event& e : x->job->take(std::chrono::milliseconds(100))) {
                out += x->builder->stream_event(e);
              }
              const bool done = x->job->done();
              if (done) out += x->builder->stream_end(*x->job);
              if (!out.empty() && !sink.write(out.data(), out.size())) return false;
              if (done) sink.done();
              return true;
            },
            release);
      } else {
        res.set_chunked_content_provider(
            "application/json",
            [x](size_t, httplib::DataSink& sink) {
              for (const Job::Event& e : x->job->take(std::chrono::milliseconds(100))) {
                x->builder->add(e);
              }
              if (!x->job->done()) return true;
              const std::string out =
                  x->builder->error().empty()
                      ? dump_json(x->builder->body(*x->job))
                      : error_body(ApiError(500, "server_error", x->builder->error()));
              if (!sink.write(out.data(), out.size())) return false;
              sink.done();
              return true;
            },
            release);
      }
    });
  };
  s.Post("/v1/chat/completions", completion(true));
  s.Post("/chat/completions", completion(true));
  s.Post("/v1/completions", completion(false));
  s.Post("/completions", completion(false));
}

}  // namespace tandem::server
