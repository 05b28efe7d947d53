#include "server/http_connection.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "core/error.h"

namespace tandem::server {
namespace {

using Clock = std::chrono::steady_clock;

thread_local Connection* t_current = nullptr;
thread_local bool t_refusing = false;

constexpr size_t kReadChunk = 16 << 10;
constexpr size_t kTrimAfterBytes = 1 << 20;

// poll() for `events` on fd until `deadline`; > 0 ready, 0 timed out, < 0 error. Waits in
// slices so that `stopping` (when given) is seen within 100 ms.
int wait_fd(int fd, short events, Clock::time_point deadline,
            const std::function<bool()>* stopping = nullptr) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return 0;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100)));
    if (r < 0 && errno == EINTR) continue;
    if (r != 0) return r < 0 ? -1 : 1;
    if (stopping != nullptr && (*stopping)()) return -1;
  }
}

void address_of(const sockaddr_storage& a, std::string& ip, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    port = ntohs(v6->sin6_port);
  }
  ip = text;
}

// Closes a connection whose client may still be sending (its request was refused or cut
// short): the response is sent first and the rest read and dropped for a moment, so that
// closing with unread bytes does not reset the connection before the client reads the answer.
void linger_close(int fd, bool linger) {
  ::shutdown(fd, SHUT_WR);
  if (linger) {
    const auto until = Clock::now() + std::chrono::seconds(1);
    char sink[4096];
    size_t dropped = 0;
    while (dropped < (1u << 20) && wait_fd(fd, POLLIN, until) > 0) {
      const ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
      if (n <= 0) break;
      dropped += static_cast<size_t>(n);
    }
  }
  ::close(fd);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Connection::Connection(int fd, const ConnectionLimits& limits)
    : fd_(fd), limits_(limits), buf_(kReadChunk) {}

Connection* Connection::current() {
  return t_current;
}

bool Connection::is_readable() const {
  if (begin_ < end_) return true;
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

bool Connection::is_writable() const {
  return wait_fd(fd_, POLLOUT, Clock::now() + limits_.write_timeout) > 0;
}

bool Connection::fill() {
  begin_ = end_ = 0;
  const Clock::time_point until = in_request_ ? deadline_ : Clock::now() + limits_.idle_timeout;
  const int ready = wait_fd(fd_, POLLIN, until);
  if (ready == 0) {
    if (in_request_) stop_ = ReadStop::kTimeout;
    return false;
  }
  if (ready < 0) return false;
  ssize_t n;
  do {
    n = ::recv(fd_, buf_.data(), buf_.size(), 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  end_ = static_cast<size_t>(n);
  return true;
}

ssize_t Connection::read(char* ptr, size_t size) {
  if (stop_ != ReadStop::kNone) return -1;
  if (begin_ == end_ && !fill()) return stop_ != ReadStop::kNone ? -1 : 0;
  size = std::min(size, end_ - begin_);
  if (in_request_) {
    if (budget_ == 0) {
      stop_ = in_headers_ ? ReadStop::kHeaderBytes : ReadStop::kBodyBytes;
      return -1;
    }
    size = std::min(size, budget_);
    budget_ -= size;
    request_bytes_ += size;
    if (in_headers_) header_text_.append(buf_.data() + begin_, size);
  }
  std::memcpy(ptr, buf_.data() + begin_, size);
  begin_ += size;
  return static_cast<ssize_t>(size);
}

ssize_t Connection::write(const char* ptr, size_t size) {
  if (wait_fd(fd_, POLLOUT, Clock::now() + limits_.write_timeout) <= 0) return -1;
  ssize_t n;
  do {
    n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n < 0 ? -1 : n;
}

void Connection::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) address_of(a, ip, port);
}

void Connection::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) address_of(a, ip, port);
}

bool Connection::wait_for_request(const std::function<bool()>& stopping) {
  if (begin_ < end_) return true;  // pipelined: the next request is read already
  return wait_fd(fd_, POLLIN, Clock::now() + limits_.idle_timeout, &stopping) > 0;
}

void Connection::begin_request() {
  in_request_ = true;
  in_headers_ = true;
  deadline_ = Clock::now() + limits_.request_timeout;
  budget_ = limits_.header_bytes;
  request_bytes_ = 0;
  header_text_.clear();
}

void Connection::headers_done() {
  in_headers_ = false;
  budget_ = limits_.body_bytes;
}

std::string Connection::raw_header(std::string_view name) const {
  // Lines after the request line: "Name: value\r\n" (names case-insensitive, the value without
  // the spaces around it).
  size_t at = header_text_.find('\n');
  while (at != std::string::npos && at + 1 < header_text_.size()) {
    const size_t start = at + 1;
    const size_t end = header_text_.find('\n', start);
    const std::string_view line(header_text_.data() + start,
                                (end == std::string::npos ? header_text_.size() : end) - start);
    const size_t colon = line.find(':');
    if (colon == name.size() &&
        std::equal(name.begin(), name.end(), line.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        })) {
      std::string_view v = line.substr(colon + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == '\r' || v.back() == ' ' || v.back() == '\t')) {
        v.remove_suffix(1);
      }
      return std::string(v);
    }
    at = end;
  }
  return {};
}

// ---------------------------------------------------------------------------------------------

ConnectionPool::ConnectionPool(size_t threads) : threads_(threads) {
  try {
    workers_.reserve(threads);
    for (size_t i = 0; i < threads; ++i) {
      workers_.emplace_back([this] { run(&waiting_, &cond_, true); });
    }
    refuser_ = std::thread([this] {
      t_refusing = true;
      run(&refused_, &refuse_cond_, false);
    });
  } catch (const std::system_error& e) {
    const size_t started = workers_.size();
    shutdown();
    fail(ErrorKind::kResource,
         "cannot start {} HTTP threads (started {}): {}; give a smaller --http-threads", threads,
         started, e.what());
  }
}

ConnectionPool::~ConnectionPool() {
  shutdown();
}

bool ConnectionPool::refusing() {
  return t_refusing;
}

void ConnectionPool::enqueue(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (busy_ + waiting_.size() < 2 * threads_) {  // served and waiting
      waiting_.push_back(std::move(fn));
      cond_.notify_one();
      return;
    }
    refused_.push_back(std::move(fn));
  }
  refuse_cond_.notify_one();
}

void ConnectionPool::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = true;
  }
  cond_.notify_all();
  refuse_cond_.notify_all();
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
  if (refuser_.joinable()) refuser_.join();
}

// A thread's loop: the tasks of `queue` until shutdown; `serving` counts them in busy_.
void ConnectionPool::run(std::deque<std::function<void()>>* queue, std::condition_variable* cond,
                         bool serving) {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cond->wait(lock, [&] { return shutdown_ || !queue->empty(); });
      if (queue->empty()) return;
      fn = std::move(queue->front());
      queue->pop_front();
      if (serving) ++busy_;
    }
    fn();
    if (serving) {
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_;
    }
  }
}

// ---------------------------------------------------------------------------------------------

ConnectionServer::ConnectionServer(const ConnectionLimits& limits) : limits_(limits) {
  set_keep_alive_max_count(static_cast<size_t>(limits.max_requests));
  set_keep_alive_timeout(
      std::chrono::duration_cast<std::chrono::seconds>(limits.idle_timeout).count());
  // A response that ends its connection says so (and offers no keep-alive).
  set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    const Connection* conn = Connection::current();
    if (conn != nullptr && conn->closing()) {
      res.set_header("Connection", "close");
      res.headers.erase("Keep-Alive");
    }
  });
  set_socket_options([](socket_t sock) {
    // SO_REUSEADDR alone: a restarted server binds past TIME_WAIT, a second one fails.
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

void ConnectionServer::raise_backlog(int n) {
  ::listen(svr_sock_, n);
}

bool ConnectionServer::process_and_close_socket(socket_t sock) {
  if (ConnectionPool::refusing()) {
    char sink[4096];
    while (::recv(sock, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
    }
    const std::string body =
        R"({"error":{"message":"the server has no connection free (--http-threads); retry )"
        R"(later","type":"server_error","param":null,"code":503}})";
    const std::string reply = fmt::format(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        "Content-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{}",
        body.size(), body);
    // One non-blocking send (the reply fits in any socket buffer): a client that does not read
    // cannot hold the one thread that refuses.
    (void)::send(sock, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    linger_close(sock, false);
    return false;
  }
  Connection conn(sock, limits_);
  t_current = &conn;
  const std::function<bool()> stopping = [this] { return svr_sock_ == INVALID_SOCKET; };
  for (int i = 0; i < limits_.max_requests; ++i) {
    if (!conn.wait_for_request(stopping)) break;
    conn.begin_request();
    bool closed = false;
    const bool last = i + 1 == limits_.max_requests;
    const bool go_on = process_request(conn, last, closed, nullptr) && !closed && !conn.closing();
    // glibc keeps the memory of large bodies in its per-thread arenas: handed back, or a few
    // hundred requests of megabytes each keep hundreds of megabytes resident.
    if (conn.request_bytes() > kTrimAfterBytes) ::malloc_trim(0);
    if (!go_on) break;
  }
  t_current = nullptr;
  linger_close(sock, conn.read_stop() != ReadStop::kNone || conn.closing());
  return true;
}

}  // namespace tandem::server
