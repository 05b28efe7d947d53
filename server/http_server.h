// `tandem serve`'s HTTP side (cpp-httplib): the OpenAI routes, /health, /metrics, /tokenize,
// /detokenize; the API key; OpenAI-shaped errors for everything refused. The server answers
// (/health: 503 "loading") from the moment it is bound, before the model is loaded. Its
// connections are bounded in time, bytes and threads (server/http_connection.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "server/http_connection.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/scheduler.h"

namespace tandem::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;             // 0: any free port (port() tells which)
  std::string api_key;         // empty: none asked for
  size_t max_body = 8u << 20;  // request bodies larger: 413
  int threads = 64;            // connections served at once (as many more wait; beyond: 503)
  int timeout_s = 60;          // for a request's headers and body to arrive (then 408)
  bool webui = true;           // the chat page at /
};

class HttpServer {
 public:
  explicit HttpServer(const HttpOptions& options);
  ~HttpServer();
  // Binds and starts answering on a thread. Error(kIo) naming host:port when it cannot bind (in
  // use, by another server too), Error(kResource) when its threads cannot be started.
  void start();
  // The model is loaded: requests go to the scheduler from now on. (Both outlive the server's
  // stop().)
  void ready(const ModelInfo* model, Scheduler* scheduler);
  // Stops answering and joins the thread.
  void stop();
  int port() const { return port_; }
  Metrics& metrics() { return metrics_; }

 private:
  void routes();
  // Before a request's body is read: its framing, the API key, whether the model is loaded.
  httplib::Server::HandlerResponse admit(const httplib::Request& req, httplib::Response& res);
  // The body of an error status (4xx / 5xx) in OpenAI's shape, for what cut a request short.
  void answer_status(const httplib::Request& req, httplib::Response& res) const;
  void models(httplib::Response& res) const;
  void tokenize(const httplib::Request& req, httplib::Response& res) const;
  void detokenize(const httplib::Request& req, httplib::Response& res) const;
  void count_tokens(const httplib::Request& req, httplib::Response& res) const;
  void apply_template(const httplib::Request& req, httplib::Response& res) const;
  void complete(const httplib::Request& req, httplib::Response& res, Api api);
  HttpOptions options_;
  std::unique_ptr<ConnectionServer> http_;
  std::unique_ptr<ConnectionPool> pool_;  // until the listening thread takes it
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};
  int port_ = 0;
  std::atomic<const ModelInfo*> model_{nullptr};
  std::atomic<Scheduler*> scheduler_{nullptr};
  std::atomic<uint64_t> next_id_{0};
  Metrics metrics_;
};

}  // namespace tandem::server
