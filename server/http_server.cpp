#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <ctime>

#include "core/error.h"
#include "server/request_fields.h"
#include "server/webui_page.h"

namespace tandem::server {
namespace {

void send_error(httplib::Response& res, const ApiError& e, Api api) {
  res.status = e.status;
  if (e.status == 429) res.set_header("Retry-After", "1");
  res.set_content(error_body(e, api), "application/json");
}

std::string status_message(const httplib::Request& req, int status, const HttpOptions& options) {
  switch (status) {
    case 404:
      return fmt::format("no route {} {}", req.method, req.path);
    case 405:
      return fmt::format("{} is not allowed on {}", req.method, req.path);
    case 408:
      return fmt::format("the request did not arrive within {} s (--timeout)", options.timeout_s);
    case 413:
      return fmt::format(
          "the request body is larger than the server's limit of {} bytes "
          "(--max-body)",
          options.max_body);
    case 414:
      return "the request line is too long";
    case 431:
      return "the request's headers are larger than 64 KiB";
    default:
      return fmt::format("HTTP {}", status);
  }
}

Json parse_body(const httplib::Request& req, const HttpOptions& options) {
  if (req.body.size() > options.max_body) {  // (chunked: read up to the connection's budget)
    throw ApiError(413, "invalid_request_error", status_message(req, 413, options));
  }
  return parse_json_body(req.body);
}

// The status of a request whose reading stopped short (ReadStop), 0 when it did not.
int read_stop_status(const Connection* conn) {
  switch (conn != nullptr ? conn->read_stop() : ReadStop::kNone) {
    case ReadStop::kTimeout:
      return 408;
    case ReadStop::kHeaderBytes:
      return 431;
    case ReadStop::kBodyBytes:
      return 413;
    default:
      return 0;
  }
}

// A request body is read only when its size is known to fit: Content-Length within the limit,
// or chunked (read against the connection's byte budget, then checked); compressed bodies are
// refused (a small one may inflate without bound), as is a body with both framings or neither.
void check_body_framing(const httplib::Request& req, const HttpOptions& options) {
  const std::string encoding = req.get_header_value("Content-Encoding");
  if (!encoding.empty() && encoding != "identity") {
    throw ApiError(415, "invalid_request_error",
                   fmt::format("compressed request bodies are not accepted (Content-Encoding: {})",
                               printable(encoding, 40)));
  }
  const bool chunked = req.has_header("Transfer-Encoding");
  if (chunked && req.get_header_value("Transfer-Encoding") != "chunked") {
    throw ApiError(501, "invalid_request_error",
                   fmt::format("Transfer-Encoding '{}' is not supported (chunked is)",
                               printable(req.get_header_value("Transfer-Encoding"), 40)));
  }
  if (req.has_header("Content-Length")) {
    const std::string text = req.get_header_value("Content-Length");
    if (chunked || req.get_header_value_count("Content-Length") != 1 || text.empty() ||
        text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos) {
      throw ApiError(400, "invalid_request_error",
                     "the request's Content-Length is not one number, or comes with chunked "
                     "Transfer-Encoding");
    }
    if (std::stoull(text) > options.max_body) {
      throw ApiError(413, "invalid_request_error", status_message(req, 413, options));
    }
  } else if (!chunked) {
    throw ApiError(411, "invalid_request_error",
                   "a request with a body needs Content-Length or chunked Transfer-Encoding");
  }
}

// Compares in time independent of where the strings differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

// What one completion request holds while its response is written.
struct Exchange {
  ApiRequest request;
  std::shared_ptr<Job> job;
  std::unique_ptr<ResponseWriter> builder;
  bool started = false;
};

// A response written as it is produced: chunked to HTTP/1.1 clients; to HTTP/1.0 ones (which
// do not read chunked bodies) without a length, the connection closing at its end.
void provide_content(const httplib::Request& req, httplib::Response& res, const char* type,
                     httplib::ContentProviderWithoutLength provider,
                     httplib::ContentProviderResourceReleaser release) {
  if (req.version == "HTTP/1.0") {
    if (Connection* conn = Connection::current()) conn->close_after_response();
    res.set_content_provider(type, std::move(provider), std::move(release));
  } else {
    res.set_chunked_content_provider(type, std::move(provider), std::move(release));
  }
}

// Runs `f`, answering what it throws in the error shape of the request's API.
template <typename F>
httplib::Server::Handler guarded(F f) {
  return [f](const httplib::Request& req, httplib::Response& res) {
    try {
      f(req, res);
    } catch (const ApiError& e) {
      send_error(res, e, api_of_path(req.path));
    } catch (const Error& e) {
      send_error(res, api_error(e), api_of_path(req.path));
    }
  };
}

// A streamed completion's body: SSE chunks as the events come, [DONE] at the end.
httplib::ContentProviderWithoutLength stream_events(std::shared_ptr<Exchange> x) {
  return [x](size_t, httplib::DataSink& sink) {
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
  };
}

// A whole completion's body, written once its completions end.
httplib::ContentProviderWithoutLength whole_body(std::shared_ptr<Exchange> x) {
  const Api api = x->request.api;
  return [x, api](size_t, httplib::DataSink& sink) {
    for (const Job::Event& e : x->job->take(std::chrono::milliseconds(100))) {
      x->builder->add(e);
    }
    if (!x->job->done()) return true;
    const std::string out =
        x->builder->error().empty()
            ? dump_json(x->builder->body(*x->job))
            : error_body(ApiError(500, "server_error", x->builder->error()), api);
    if (!sink.write(out.data(), out.size())) return false;
    sink.done();
    return true;
  };
}

ConnectionLimits connection_limits(const HttpOptions& o) {
  if (o.threads < 1) {
    fail(ErrorKind::kInvalidArgument, "--http-threads must be >= 1, got {}", o.threads);
  }
  if (o.port < 0 || o.port > 65535) {
    fail(ErrorKind::kInvalidArgument, "--port must be in [0, 65535], got {}", o.port);
  }
  if (o.timeout_s < 1) {
    fail(ErrorKind::kInvalidArgument, "--timeout must be >= 1, got {}", o.timeout_s);
  }
  ConnectionLimits l;
  l.request_timeout = std::chrono::seconds(o.timeout_s);
  l.body_bytes = o.max_body + (64u << 10);  // chunked framing; the body itself is checked after
  return l;
}

}  // namespace

HttpServer::HttpServer(const HttpOptions& options)
    : options_(options), http_(std::make_unique<ConnectionServer>(connection_limits(options))) {
  routes();
}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::start() {
  pool_ = std::make_unique<ConnectionPool>(static_cast<size_t>(options_.threads));
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
  http_->raise_backlog(SOMAXCONN);
  thread_ = std::thread([this] {
    http_->listen_after_bind();
    listen_returned_ = true;
  });
  // stop() stops only a running server: wait until it runs, or a stop right after start (a
  // model that fails to load) would leave the thread listening for ever.
  while (!http_->is_running() && !listen_returned_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
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

httplib::Server::HandlerResponse HttpServer::admit(const httplib::Request& req,
                                                  httplib::Response& res) {
  using httplib::Server;
  Connection* conn = Connection::current();
  if (conn != nullptr) conn->headers_done();
  const auto refuse = [&](const ApiError& e) {
    if (conn != nullptr) conn->close_after_response();  // (its body is not read)
    send_error(res, e, api_of_path(req.path));
    return Server::HandlerResponse::Handled;
  };
  try {
    if (req.method == "POST" || req.method == "PUT" || req.method == "PATCH") {
      check_body_framing(req, options_);
    }
  } catch (const ApiError& e) {
    return refuse(e);
  }
  // (the page holds no data: it asks for the key itself)
  if (req.path == "/health" || (req.path == "/" && options_.webui)) {
    return Server::HandlerResponse::Unhandled;
  }
  // The headers as sent (cpp-httplib percent-decodes header values): OpenAI's clients send the
  // key as 'Authorization: Bearer KEY', Anthropic's as 'x-api-key: KEY'.
  if (!options_.api_key.empty()) {
    const std::string bearer = conn != nullptr ? conn->raw_header("Authorization") : "";
    const std::string key = conn != nullptr ? conn->raw_header("x-api-key") : "";
    if (!same_secret(bearer, "Bearer " + options_.api_key) && !same_secret(key, options_.api_key)) {
      return refuse(ApiError(401, "authentication_error",
                             "a valid API key is needed: 'Authorization: Bearer KEY' or "
                             "'x-api-key: KEY'"));
    }
  }
  if (model_.load() == nullptr && req.path != "/metrics") {
    return refuse(ApiError(503, "unavailable_error", "the model is loading"));
  }
  return Server::HandlerResponse::Unhandled;
}

void HttpServer::answer_status(const httplib::Request& req, httplib::Response& res) const {
  // A request cut short (too slow, too large) is answered for what cut it, and its connection
  // closed: what is left of it is unread.
  if (const int status = read_stop_status(Connection::current())) {
    res.status = status;
    res.body.clear();
  }
  if (res.body.empty() && !res.is_chunked_content_provider_) {
    const std::string type = res.status >= 500 ? "server_error" : "invalid_request_error";
    res.set_content(error_body(ApiError(res.status, type, status_message(req, res.status, options_)),
                               api_of_path(req.path)),
                    "application/json");
  }
}

void HttpServer::models(httplib::Response& res) const {
  const ModelInfo& m = *model_.load();
  Json data = Json::array({{{"id", m.name},
                            {"object", "model"},
                            {"created", static_cast<int64_t>(std::time(nullptr))},
                            {"owned_by", "tandem"},
                            {"context_length", m.context}}});
  res.set_content(dump_json(Json({{"object", "list"}, {"data", data}})), "application/json");
}

void HttpServer::tokenize(const httplib::Request& req, httplib::Response& res) const {
  const ModelInfo& m = *model_.load();
  const Json body = parse_body(req, options_);
  if (!body.is_object() || !body.contains("content") || !body["content"].is_string()) {
    bad_request("content", "'content' must be a string");
  }
  bool add_special = false, with_pieces = false;
  boolean(body, "add_special", &add_special);
  boolean(body, "with_pieces", &with_pieces);
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
}

void HttpServer::detokenize(const httplib::Request& req, httplib::Response& res) const {
  const ModelInfo& m = *model_.load();
  const Json body = parse_body(req, options_);
  if (!body.is_object() || !body.contains("tokens")) {
    bad_request("tokens", "'tokens' must be an array of token ids");
  }
  const std::vector<int32_t> ids = token_ids(body["tokens"], m, "tokens");
  res.set_content(dump_json(Json({{"content", m.tokenizer->decode(ids)}})), "application/json");
}

void HttpServer::apply_template(const httplib::Request& req, httplib::Response& res) const {
  const ApiRequest r = parse_chat_request(parse_body(req, options_), *model_.load());
  res.set_content(dump_json(Json({{"prompt", r.prompt_text}})), "application/json");
}

void HttpServer::count_tokens(const httplib::Request& req, httplib::Response& res) const {
  const ApiRequest r = parse_count_tokens_request(parse_body(req, options_), *model_.load());
  res.set_content(dump_json(Json({{"input_tokens", r.prompt.size()}})), "application/json");
}

// A completion: the request parsed and admitted by the scheduler, then its events written as
// they come (streamed) or as one body at the end.
void HttpServer::complete(const httplib::Request& req, httplib::Response& res, Api api) {
  const ModelInfo& m = *model_.load();
  Scheduler& sched = *scheduler_.load();
  const Json body = parse_body(req, options_);
  auto x = std::make_shared<Exchange>();
  switch (api) {
    case Api::kCompletions:
      x->request = parse_completion_request(body, m);
      break;
    case Api::kChat:
      x->request = parse_chat_request(body, m);
      break;
    case Api::kResponses:
      x->request = parse_responses_request(body, m);
      break;
    case Api::kMessages:
      x->request = parse_messages_request(body, m);
      break;
  }
  x->job = sched.submit(x->request.prompt, x->request.params, x->request.n);
  Error refused(ErrorKind::kInternal, "");
  if (!x->job->wait_accepted(&refused)) throw api_error(refused);
  x->builder = make_response_writer(x->request, m, next_id_.fetch_add(1),
                                    static_cast<int64_t>(std::time(nullptr)));
  // A client that goes away cancels its completions (their blocks are freed at the next step).
  Scheduler* sp = &sched;
  const auto release = [sp, x](bool success) {
    if (!success && !x->job->done()) sp->cancel(x->job);
  };
  if (x->request.stream) {
    res.set_header("Cache-Control", "no-cache");
    provide_content(req, res, "text/event-stream", stream_events(x), release);
  } else {
    provide_content(req, res, "application/json", whole_body(x), release);
  }
}

void HttpServer::routes() {
  using httplib::Request;
  using httplib::Response;
  httplib::Server& s = *http_;
  s.new_task_queue = [this] { return pool_.release(); };
  s.set_payload_max_length(options_.max_body);
  s.set_pre_routing_handler(
      [this](const Request& req, Response& res) { return admit(req, res); });
  s.set_error_handler(httplib::Server::HandlerWithResponse([this](const Request& req,
                                                                  Response& res) {
    answer_status(req, res);
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const Request& req, Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, "server_error", what), api_of_path(req.path));
  });
  s.set_logger([this](const Request&, const Response& res) { metrics_.http_response(res.status); });

  s.Get("/health", [this](const Request&, Response& res) {
    if (model_.load() == nullptr) {
      res.status = 503;
      res.set_content(R"({"status":"loading"})", "application/json");
    } else {
      res.set_content(R"({"status":"ok"})", "application/json");
    }
  });
  if (options_.webui) {
    s.Get("/", [](const Request&, Response& res) {
      // Everything the page uses is in it: nothing may be loaded from elsewhere.
      res.set_header("Content-Security-Policy",
                     "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                     "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'");
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_content(kChatPage, sizeof(kChatPage) - 1, "text/html; charset=utf-8");
    });
  }
  s.Get("/metrics", [this](const Request&, Response& res) {
    res.set_content(metrics_.render(), "text/plain; version=0.0.4");
  });
  for (const char* path : {"/v1/models", "/models"}) {
    s.Get(path, guarded([this](const Request&, Response& res) { models(res); }));
  }
  s.Post("/tokenize", guarded([this](const Request& q, Response& r) { tokenize(q, r); }));
  s.Post("/detokenize", guarded([this](const Request& q, Response& r) { detokenize(q, r); }));
  const std::pair<const char*, Api> apis[] = {{"/chat/completions", Api::kChat},
                                              {"/completions", Api::kCompletions},
                                              {"/responses", Api::kResponses},
                                              {"/messages", Api::kMessages}};
  for (const auto& [path, api] : apis) {
    for (const char* prefix : {"/v1", ""}) {
      s.Post(std::string(prefix) + path,
             guarded([this, api = api](const Request& q, Response& r) { complete(q, r, api); }));
    }
  }
  s.Post("/apply-template",
         guarded([this](const Request& q, Response& r) { apply_template(q, r); }));
  for (const char* path : {"/v1/messages/count_tokens", "/messages/count_tokens"}) {
    s.Post(path, guarded([this](const Request& q, Response& r) { count_tokens(q, r); }));
  }
}

}  // namespace tandem::server
