// A `tandem serve` process for the server tests: started on a free loopback port (--port 0, the
// port read from its "listening on" line), ready once /health answers 200, stopped with SIGTERM
// (it must then exit 0).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace tandem::test {

inline std::string tandem_binary() {
  const char* bin = std::getenv("TANDEM_BIN");
  return bin ? bin : std::string(TANDEM_BINARY_DIR) + "/tandem";
}

// Starts `tandem serve ARGS` with its stderr in `log`; in the child, `setup` runs first (limits).
inline pid_t spawn_serve(std::vector<std::string> args, const std::string& log,
                         const std::function<void()>& setup = nullptr) {
  args.insert(args.begin(), {tandem_binary(), "serve"});
  const pid_t pid = fork();
  if (pid == 0) {
    if (setup) setup();
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// VmRSS of a process in KiB.
inline int64_t rss_kib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  ADD_FAILURE() << "no VmRSS for " << pid;
  return -1;
}

// A value of the server's /metrics.
inline double metric(httplib::Client& c, const std::string& name) {
  const auto res = c.Get("/metrics");
  EXPECT_TRUE(res && res->status == 200);
  std::istringstream in(res ? res->body : "");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  ADD_FAILURE() << "no metric " << name;
  return -1;
}

class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> args) : tmp_("serve") {
    log_ = (tmp_ / "stderr").string();
    args.insert(args.begin(), {"--port", "0"});
    pid_ = spawn_serve(std::move(args), log_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    while (std::chrono::steady_clock::now() < deadline) {
      std::smatch m;
      const std::string log = this->log();
      if (port_ == 0 && std::regex_search(log, m, listening)) port_ = std::stoi(m[1]);
      if (port_ != 0) {
        httplib::Client c("127.0.0.1", port_);
        const auto r = c.Get("/health");
        if (r && r->status == 200) return;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "tandem serve exited early:\n" << log;
        throw std::runtime_error("tandem serve exited");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "tandem serve did not become ready:\n" << log();
    throw std::runtime_error("tandem serve not ready");
  }

  ~ServerProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 200 && waitpid(pid_, &status, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (i == 199) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        ADD_FAILURE() << "tandem serve did not stop on SIGTERM";
      }
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "exit status " << status << "\n"
                                                               << log();
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(120);
    return c;
  }
  std::string log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  TempDir tmp_;
  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace tandem::test
