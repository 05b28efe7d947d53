// Reference data from llama.cpp for tandem's golden tests (built beside the project, never part
// of tandem's build: scripts/golden/make-golden.sh compiles it against a llama.cpp build).
//
//   llama_ref logits MODEL.gguf OUT.f32 ID,ID,...   every prompt position's logits (F32 KV
//       cache, flash attention off, 1 thread, the prompt in one batch) into OUT.f32; prints a
//       JSON object: {"greedy": [16 ids], "expert_usage": {"ffn_moe_topk-L": {"e": count}}}
//   llama_ref tokenize VOCAB.gguf CASES.inp   each case of a llama.cpp test-vector file (cases
//       ended by lines `__ggml_vocab_test__`) tokenized as llama.cpp does (no BOS, special
//       tokens not parsed): one line of ids per case, the matching .out file.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

namespace {

std::map<std::string, std::map<int, int>> g_usage;
std::map<int, std::vector<std::vector<int32_t>>> g_routing;  // layer -> per position, the ids
bool g_record = false;

bool on_tensor(ggml_tensor* t, bool ask, void*) {
  const bool topk = std::strncmp(t->name, "ffn_moe_topk-", 13) == 0;
  if (ask) return topk;
  if (topk && g_record && t->type == GGML_TYPE_I32) {
    // [k, n_tokens], a view into the routing's argsort: row by row, by the view's strides.
    std::vector<int32_t> row(t->ne[0]);
    for (int64_t r = 0; r < t->ne[1]; ++r) {
      ggml_backend_tensor_get(t, row.data(), r * t->nb[1], row.size() * sizeof(int32_t));
      for (int32_t id : row) ++g_usage[t->name][id];
      g_routing[std::atoi(t->name + 13)].push_back(row);
    }
  }
  return true;
}

int fail(const char* what) {
  std::fprintf(stderr, "llama_ref: %s\n", what);
  return 1;
}

int logits(const char* model_path, const char* out_path, const char* ids_text, bool usage) {
  std::vector<llama_token> tokens;
  for (const char* p = ids_text; *p;) {
    char* end = nullptr;
    tokens.push_back(static_cast<llama_token>(std::strtol(p, &end, 10)));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) return fail("bad token list");
  }
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(model_path, mp);
  if (!model) return fail("cannot load the model");
  llama_context_params cp = llama_context_default_params();
  // Room for the prompt and the 16 greedy tokens; the whole prompt in one batch.
  const uint32_t need = static_cast<uint32_t>(tokens.size()) + 16;
  cp.n_ctx = std::max<uint32_t>(256, (need + 255) / 256 * 256);
  cp.n_batch = std::max<uint32_t>(512, cp.n_ctx);
  cp.n_ubatch = cp.n_batch;
  cp.n_threads = cp.n_threads_batch = 1;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.cb_eval = on_tensor;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return fail("cannot make a context");
  const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const int n = static_cast<int>(tokens.size());
  llama_batch b = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    b.token[i] = tokens[i];
    b.pos[i] = i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = 1;
  }
  b.n_tokens = n;
  g_record = usage;
  if (llama_decode(ctx, b) != 0) return fail("decode failed");
  g_record = false;
  std::ofstream out(out_path, std::ios::binary);
  for (int i = 0; i < n; ++i) {
    out.write(reinterpret_cast<const char*>(llama_get_logits_ith(ctx, i)), nv * sizeof(float));
  }
  std::vector<llama_token> greedy;
  const float* last = llama_get_logits_ith(ctx, n - 1);
  for (int step = 0; step < 16; ++step) {
    int best = 0;
    for (int j = 1; j < nv; ++j) best = last[j] > last[best] ? j : best;
    greedy.push_back(best);
    if (step == 15) break;
    llama_batch one = llama_batch_init(1, 0, 1);
    one.token[0] = best;
    one.pos[0] = n + step;
    one.n_seq_id[0] = 1;
    one.seq_id[0][0] = 0;
    one.logits[0] = 1;
    one.n_tokens = 1;
    if (llama_decode(ctx, one) != 0) return fail("decode failed");
    llama_batch_free(one);
    last = llama_get_logits_ith(ctx, 0);
  }
  std::printf("{\"greedy\": [");
  for (size_t i = 0; i < greedy.size(); ++i) std::printf("%s%d", i ? ", " : "", greedy[i]);
  std::printf("], \"expert_usage\": {");
  bool first = true;
  for (const auto& [name, counts] : g_usage) {
    std::printf("%s\"%s\": {", first ? "" : ", ", name.c_str());
    first = false;
    bool f2 = true;
    for (const auto& [e, c] : counts) {
      std::printf("%s\"%d\": %d", f2 ? "" : ", ", e, c);
      f2 = false;
    }
    std::printf("}");
  }
  // Per prompt position, every MoE layer's selected ids (in layer order, each layer's ids in
  // llama.cpp's order): where tandem's choice first differs, a near tie was broken differently.
  std::printf("}, \"experts\": [");
  for (int i = 0; i < n; ++i) {
    std::printf("%s[", i ? ", " : "");
    bool f3 = true;
    for (const auto& [layer, rows] : g_routing) {
      for (int32_t id : rows.at(i)) {
        std::printf("%s%d", f3 ? "" : ", ", id);
        f3 = false;
      }
    }
    std::printf("]");
  }
  std::printf("]}\n");
  llama_batch_free(b);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}

int tokenize(const char* vocab_path, const char* input) {
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(vocab_path, mp);
  if (!model) return fail("cannot load the vocabulary");
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::ifstream in(input, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str(), sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0, end; (end = all.find(sep, pos)) != std::string::npos;
       pos = end + sep.size()) {
    const std::string text = all.substr(pos, end - pos);
    std::vector<llama_token> ids(text.size() + 16);
    const int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                                 static_cast<int32_t>(ids.size()), false, false);
    if (n < 0) return fail("tokenize failed");
    for (int i = 0; i < n; ++i) std::printf(" %d", ids[i]);
    std::printf("\n");
  }
  llama_model_free(model);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ggml_backend_load_all();
  llama_log_set([](ggml_log_level level, const char* text, void*) {
    if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
  }, nullptr);
  if (argc == 5 && std::strcmp(argv[1], "logits") == 0) {
    return logits(argv[2], argv[3], argv[4], true);
  }
  if (argc == 4 && std::strcmp(argv[1], "tokenize") == 0) return tokenize(argv[2], argv[3]);
  return fail("usage: llama_ref logits MODEL OUT.f32 IDS | llama_ref tokenize VOCAB INPUT");
}
