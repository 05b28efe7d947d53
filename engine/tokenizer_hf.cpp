// Hugging Face `tokenizer.json` for byte-level BPE models (GPT-2, Llama 3, Qwen, DeepSeek V2/V3):
// model.vocab / model.merges, added_tokens, and the pre_tokenizer (Sequence, Split with its regex,
// ByteLevel, Digits) turned into the same PCRE2 split chain the GGUF path uses. BOS/EOS come from
// the post_processor template. Anything else that changes the text (normalizers, Unigram or
// WordPiece models, byte_fallback BPE) is refused with Error(kUnsupported) naming the field.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_file.h"
#include "engine/tokenizer_impl.h"

namespace tandem {
namespace {

using nlohmann::json;

// PCRE2 quoting of a literal Split pattern ({"String": ...}).
std::string quote_literal(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos)
      out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

void collect_patterns(const std::string& file, const json& pt, std::vector<std::string>& out) {
  if (pt.is_null()) return;
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    for (const json& p : pt.at("pretokenizers")) collect_patterns(file, p, out);
  } else if (type == "Split") {
    const json& pattern = pt.at("pattern");
    if (pt.value("behavior", "") != "Isolated" || pt.value("invert", false)) {
      fail(ErrorKind::kUnsupported, "{}: pre_tokenizer Split behavior '{}'{} (only Isolated)", file,
           pt.value("behavior", ""), pt.value("invert", false) ? " inverted" : "");
    }
    if (pattern.contains("Regex")) {
      out.push_back(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String")) {
      out.push_back(quote_literal(pattern["String"].get<std::string>()));
    } else {
      fail(ErrorKind::kFormat, "{}: pre_tokenizer Split without a pattern", file);
    }
  } else if (type == "ByteLevel") {
    if (pt.value("add_prefix_space", false)) {
      fail(ErrorKind::kUnsupported, "{}: pre_tokenizer ByteLevel add_prefix_space", file);
    }
    if (pt.value("use_regex", true)) out.push_back(tokenizer_detail::PreTokenizer::gpt2_pattern());
  } else if (type == "Digits") {
    out.push_back(pt.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
  } else {
    fail(ErrorKind::kUnsupported, "{}: pre_tokenizer type '{}'", file, printable(type));
  }
}

// The special token a TemplateProcessing "single" template puts before (front) / after the text.
void template_specials(const json& pp, std::string& front, std::string& back) {
  if (pp.is_null()) return;
  const std::string type = pp.value("type", "");
  if (type == "Sequence") {
    for (const json& p : pp.at("processors")) template_specials(p, front, back);
    return;
  }
  if (type != "TemplateProcessing" || !pp.contains("single")) return;
  const json& single = pp["single"];
  if (!single.is_array() || single.empty()) return;
  auto special_of = [](const json& item) -> std::string {
    if (item.contains("SpecialToken")) return item["SpecialToken"].value("id", "");
    return "";
  };
  front = special_of(single.front());
  if (single.size() > 1) back = special_of(single.back());
}

}  // namespace

Tokenizer Tokenizer::from_hf_json(const std::filesystem::path& path) {
  const std::string file = path.string();
  const std::string text = read_input_file(path, kMaxTokenizerFileBytes);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(ErrorKind::kFormat, "{}: {}", file, e.what());
  }
  auto t = std::make_unique<Impl>();
  t->source = file;
  t->model = TokenizerModel::kByteLevelBpe;
  t->pre_name = "tokenizer.json";
  try {
    const json& model = j.at("model");
    if (model.value("type", "BPE") != "BPE") {
      fail(ErrorKind::kUnsupported, "{}: model type '{}' (only BPE)", file,
           model.value("type", ""));
    }
    if (model.value("byte_fallback", false)) {
      fail(ErrorKind::kUnsupported,
           "{}: model.byte_fallback (SentencePiece-style BPE): use the tokenizer.model", file);
    }
    if (!j.value("normalizer", json()).is_null()) {
      fail(ErrorKind::kUnsupported, "{}: normalizer '{}'", file,
           j["normalizer"].value("type", "?"));
    }
    const json& vocab = model.at("vocab");
    const json added = j.value("added_tokens", json::array());
    // Ids must be dense enough that the table they index stays the size of the file's content.
    const size_t limit = vocab.size() + added.size();
    auto place = [&](int64_t id, const std::string& text, TokenType type) {
      if (id < 0 || uint64_t(id) >= limit) {
        fail(ErrorKind::kFormat, "{}: token '{}' has id {} (expected below {})", file, text, id,
             limit);
      }
      if (size_t(id) >= t->texts.size()) {
        t->texts.resize(size_t(id) + 1);
        t->types.resize(size_t(id) + 1, TokenType::kUnused);
      }
      t->texts[id] = text;
      t->types[id] = type;
    };
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      place(it.value().get<int64_t>(), it.key(), TokenType::kNormal);
    }
    for (const json& a : added) {
      place(a.at("id").get<int64_t>(), a.at("content").get<std::string>(),
            a.value("special", false) ? TokenType::kControl : TokenType::kUserDefined);
    }
    const size_t n = t->texts.size();
    t->scores.assign(n, 0.0f);
    t->rstrip.assign(n, false);
    t->lstrip.assign(n, false);
    for (const json& a : added) {
      size_t id = a.at("id").get<size_t>();
      t->rstrip[id] = a.value("rstrip", false);
      t->lstrip[id] = a.value("lstrip", false);
    }
    const json& merges = model.at("merges");
    t->merge_rank.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      std::string key;
      if (m.is_string()) {
        key = m.get<std::string>();
      } else if (m.is_array() && m.size() == 2) {
        key = m[0].get<std::string>() + " " + m[1].get<std::string>();
      }
      if (key.find(' ') == std::string::npos) {
        fail(ErrorKind::kFormat, "{}: model.merges[{}] is not a pair", file, i);
      }
      t->merge_rank.emplace(std::move(key), int32_t(i));
    }
    t->ignore_merges = model.value("ignore_merges", false);

    std::vector<std::string> patterns;
    collect_patterns(file, j.value("pre_tokenizer", json()), patterns);
    t->pre = std::make_unique<tokenizer_detail::PreTokenizer>(file, patterns);

    std::string front, back;
    template_specials(j.value("post_processor", json()), front, back);
    t->add_space_prefix = false;
    t->finish("", kNoToken);
    if (!front.empty()) {
      t->bos = t->find(front);
      t->add_bos = t->bos != kNoToken;
    }
    if (!back.empty()) {
      t->eos = t->find(back);
      t->add_eos = t->eos != kNoToken;
    }
  } catch (const json::exception& e) {
    fail(ErrorKind::kFormat, "{}: {}", file, e.what());
  }
  return Tokenizer(std::move(t));
}

}  // namespace tandem
