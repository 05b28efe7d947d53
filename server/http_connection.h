// How `tandem serve` holds its connections, under cpp-httplib's request parsing and routing:
// what a client may cost the server is bounded, whatever it sends or fails to send.
//  - time: one request's line, headers and body must arrive within `request_timeout` of its
//    first byte (nginx's client_header_timeout / client_body_timeout, llama-server's --timeout);
//    a connection idle between requests is closed after `idle_timeout`;
//  - bytes: headers and body are read against a budget per request, whatever the framing
//    (Content-Length, chunked, none), so a body is never read past the limit;
//  - threads: a fixed pool serves `threads` connections at once and holds as many more waiting;
//    a connection beyond those is answered 503 at once by a thread of its own;
//  - keep-alive and pipelining: one buffered stream per connection, so requests sent back to
//    back are each read and answered in order.
// cpp-httplib 0.11 (Debian 12's) gives none of these: it reads chunked or unframed bodies
// whole, resets its read buffer between requests, waits for a trickling client for as long as
// each byte comes within its read timeout, and queues connections without bound.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace tandem::server {

struct ConnectionLimits {
  std::chrono::milliseconds request_timeout{60000};  // a request's first byte to its body's last
  std::chrono::milliseconds idle_timeout{5000};      // between requests on a kept-alive connection
  std::chrono::milliseconds write_timeout{10000};    // for the client to take each part sent
  size_t header_bytes = 64 << 10;                    // request line and headers
  size_t body_bytes = 8 << 20;                       // the body, framing included
  int max_requests = 1000;                           // per connection, then it is closed
};

// Why a connection stopped reading in the middle of a request.
enum class ReadStop { kNone, kTimeout, kHeaderBytes, kBodyBytes };

// One client connection as cpp-httplib reads and writes it: buffered, with the request's
// deadline and byte budget, and the raw bytes of its header (cpp-httplib hands header values
// over percent-decoded).
class Connection : public httplib::Stream {
 public:
  Connection(int fd, const ConnectionLimits& limits);

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return fd_; }

  // Waits (up to the idle timeout, or until `stopping()`) for a request's first byte.
  bool wait_for_request(const std::function<bool()>& stopping);
  // A request starts: its deadline and header budget count from now.
  void begin_request();
  // The headers are read (the routing starts): the body's budget counts from here.
  void headers_done();
  // What stopped the last read, if anything did.
  ReadStop read_stop() const { return stop_; }
  // The value of header `name` as the client sent it ("" when absent).
  std::string raw_header(std::string_view name) const;
  // The response in progress ends the connection (it has no length, or its request could not be
  // read to its end).
  void close_after_response() { close_ = true; }
  bool closing() const { return close_ || stop_ != ReadStop::kNone; }
  const ConnectionLimits& limits() const { return limits_; }
  // Bytes of the current request read so far.
  size_t request_bytes() const { return request_bytes_; }

  // The connection of the request being handled on this thread (nullptr outside one).
  static Connection* current();

 private:
  friend class ConnectionScope;
  bool fill();  // reads more bytes into buf_, waiting until the deadline

  int fd_;
  const ConnectionLimits& limits_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  bool in_request_ = false;
  bool in_headers_ = false;
  size_t budget_ = 0;  // bytes this request may still read
  std::string header_text_;
  size_t request_bytes_ = 0;
  ReadStop stop_ = ReadStop::kNone;
  bool close_ = false;
};

// The threads that serve connections (cpp-httplib's TaskQueue): `threads` at once, as many
// more waiting; beyond that a task runs at once on the refusing thread with `refusing()` true,
// to be answered 503 and closed. Thread creation failing is an Error(kResource) naming the
// count, from the constructor.
class ConnectionPool : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(size_t threads);
  ~ConnectionPool() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;
  // True on the thread that answers connections beyond the pool's bound.
  static bool refusing();

 private:
  void run(std::deque<std::function<void()>>* queue, std::condition_variable* cond, bool serving);

  size_t threads_;
  std::mutex mutex_;
  std::condition_variable cond_, refuse_cond_;
  std::deque<std::function<void()>> waiting_, refused_;
  size_t busy_ = 0;
  bool shutdown_ = false;
  std::vector<std::thread> workers_;
  std::thread refuser_;
};

// cpp-httplib's server with the connections above: it listens alone on its port (no
// SO_REUSEPORT: a second server on the same port fails to bind), with a backlog for bursts of
// clients.
class ConnectionServer : public httplib::Server {
 public:
  explicit ConnectionServer(const ConnectionLimits& limits);
  // After binding: cpp-httplib listens with a backlog of 5.
  void raise_backlog(int n);
  const ConnectionLimits& limits() const { return limits_; }

 private:
  bool process_and_close_socket(int sock) override;
  ConnectionLimits limits_;
};

}  // namespace tandem::server
