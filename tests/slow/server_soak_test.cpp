// `tandem serve` under a steady load of mixed requests (streamed, whole, hung up, refused): its
// resident memory after warm-up stays flat -- no per-request leak.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/jinja_value.h"
#include "tests/server/server_process.h"

namespace tandem::test {
namespace {

using Json = jinja::Json;

// VmRSS of the process in KiB.
int64_t rss_kib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  ADD_FAILURE() << "no VmRSS for " << pid;
  return -1;
}

void round_of_load(const ServerProcess& server, int clients, int per_client) {
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto cli = server.client();
      for (int i = 0; i < per_client; ++i) {
        const int k = c * per_client + i;
        Json body = {{"prompt", k % 3 == 0 ? "And God said" : "In the beginning"},
                     {"max_tokens", 4 + k % 24},
                     {"temperature", 0.7},
                     {"seed", k}};
        if (k % 5 == 0) body["prompt"] = "x";
        if (k % 7 == 0) body["temperature"] = "bad";  // refused
        if (k % 2 == 0) {
          body["stream"] = true;
          httplib::Request req;
          req.method = "POST";
          req.path = "/v1/completions";
          req.headers = {{"Content-Type", "application/json"}};
          req.body = body.dump();
          size_t got = 0;
          req.content_receiver = [&](const char*, size_t n, uint64_t, uint64_t) {
            got += n;
            return k % 4 != 0 || got < 200;  // a quarter hang up early
          };
          cli->send(req);
        } else {
          cli->Post("/v1/completions", body.dump(), "application/json");
        }
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(ServeSoak, MemoryStaysFlatUnderLoad) {
  ServerProcess server(
      {"-m", data_path("demo/tandem-demo-moe-Q4_K_M.gguf").string(), "--parallel", "8"});
  round_of_load(server, 16, 20);  // warm-up: pools, caches, thread stacks
  const int64_t warm = rss_kib(server.pid());
  for (int r = 0; r < 5; ++r) round_of_load(server, 16, 20);
  const int64_t after = rss_kib(server.pid());
  // 1,600 more requests: a leak of even 2 KiB each would show as 3 MiB.
  EXPECT_LT(after - warm, 3 * 1024)
      << "RSS " << warm << " KiB after warm-up, " << after << " KiB after 1,600 more requests";
  auto c = server.client();
  EXPECT_EQ(c->Get("/health")->status, 200);
}

}  // namespace
}  // namespace tandem::test
