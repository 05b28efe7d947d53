// SentencePiece `tokenizer.model` files (a serialized sentencepiece.ModelProto) and Hugging Face
// checkpoint directories that ship one. Only the fields the BPE encoder needs are read: the pieces
// (text, score, type), the trainer's model type and special ids, and the normalizer's
// add_dummy_prefix. The protobuf wire format is decoded by hand; every length is checked against
// the bytes that remain, so a truncated or hostile file throws Error naming the file.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"
#include "engine/tokenizer_impl.h"
#include "formats/gguf.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// Field numbers in sentencepiece_model.proto.
constexpr uint32_t kModelPieces = 1, kModelTrainerSpec = 2, kModelNormalizerSpec = 3;
constexpr uint32_t kPieceText = 1, kPieceScore = 2, kPieceType = 3;
constexpr uint32_t kTrainerModelType = 3, kTrainerUnkId = 40, kTrainerBosId = 41,
                   kTrainerEosId = 42;
constexpr uint32_t kNormalizerName = 1, kNormalizerAddDummyPrefix = 3;
constexpr uint64_t kModelTypeBpe = 2;

// A cursor over one protobuf message.
class ProtoReader {
 public:
  ProtoReader(const std::string& file, std::string_view data) : file_(file), data_(data) {}
  bool done() const { return pos_ >= data_.size(); }

  // Reads a field key; returns false at the end of the message.
  bool next(uint32_t& field, uint32_t& wire) {
    if (done()) return false;
    uint64_t key = varint();
    field = uint32_t(key >> 3);
    wire = uint32_t(key & 7);
    return true;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) bad("truncated varint");
      uint8_t b = uint8_t(data_[pos_++]);
      v |= uint64_t(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    bad("varint longer than 10 bytes");
  }
  std::string_view bytes() {
    uint64_t n = varint();
    if (n > data_.size() - pos_) bad("length-delimited field runs past the end");
    std::string_view s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  float fixed32_float() {
    if (data_.size() - pos_ < 4) bad("truncated fixed32");
    float f;
    std::memcpy(&f, data_.data() + pos_, 4);
    pos_ += 4;
    return f;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case 0:
        varint();
        break;
      case 1:
        advance(8);
        break;
      case 2:
        bytes();
        break;
      case 5:
        advance(4);
        break;
      default:
        bad(fmt::format("unsupported wire type {}", wire));
    }
  }

 private:
  void advance(size_t n) {
    if (data_.size() - pos_ < n) bad("truncated field");
    pos_ += n;
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail(ErrorKind::kFormat, "{}: not a valid SentencePiece model: {} at byte {}", file_, what,
         pos_);
  }

  const std::string& file_;
  std::string_view data_;
  size_t pos_ = 0;
};

std::string read_file(const fs::path& path) {
  return read_input_file(path, kMaxTokenizerFileBytes);
}

TokenId checked_id(const std::string& file, const char* what, int64_t id, size_t n) {
  if (id < 0) return kNoToken;  // -1 disables the token in SentencePiece
  if (uint64_t(id) >= n) {
    fail(ErrorKind::kFormat, "{}: {} {} is outside the vocabulary of {}", file, what, id, n);
  }
  return TokenId(id);
}

}  // namespace

Tokenizer Tokenizer::from_sentencepiece_file(const fs::path& path) {
  const std::string file = path.string();
  const std::string data = read_file(path);
  auto t = std::make_unique<Impl>();
  t->source = file;
  t->model = TokenizerModel::kSentencePiece;
  int64_t unk = 0, bos = 1, eos = 2;  // the proto's defaults
  uint64_t model_type = 1;            // UNIGRAM unless the trainer spec says otherwise
  bool add_dummy_prefix = true;
  std::string normalizer = "identity";

  ProtoReader model(file, data);
  uint32_t field, wire;
  while (model.next(field, wire)) {
    if (field == kModelPieces && wire == 2) {
      ProtoReader piece(file, model.bytes());
      std::string text;
      float score = 0;
      uint64_t type = 1;
      while (piece.next(field, wire)) {
        if (field == kPieceText && wire == 2) {
          text = std::string(piece.bytes());
        } else if (field == kPieceScore && wire == 5) {
          score = piece.fixed32_float();
        } else if (field == kPieceType && wire == 0) {
          type = piece.varint();
        } else {
          piece.skip(wire);
        }
      }
      t->texts.push_back(std::move(text));
      t->scores.push_back(score);
      t->types.push_back(type <= 6 ? TokenType(type) : TokenType::kUndefined);
    } else if (field == kModelTrainerSpec && wire == 2) {
      ProtoReader spec(file, model.bytes());
      while (spec.next(field, wire)) {
        if (wire != 0) {
          spec.skip(wire);
        } else if (field == kTrainerModelType) {
          model_type = spec.varint();
        } else if (field == kTrainerUnkId) {
          unk = int32_t(uint32_t(spec.varint()));
        } else if (field == kTrainerBosId) {
          bos = int32_t(uint32_t(spec.varint()));
        } else if (field == kTrainerEosId) {
          eos = int32_t(uint32_t(spec.varint()));
        } else {
          spec.varint();
        }
      }
    } else if (field == kModelNormalizerSpec && wire == 2) {
      ProtoReader spec(file, model.bytes());
      while (spec.next(field, wire)) {
        if (field == kNormalizerName && wire == 2) {
          normalizer = std::string(spec.bytes());
        } else if (field == kNormalizerAddDummyPrefix && wire == 0) {
          add_dummy_prefix = spec.varint() != 0;
        } else {
          spec.skip(wire);
        }
      }
    } else {
      model.skip(wire);
    }
  }
  const size_t n = t->texts.size();
  if (n == 0) fail(ErrorKind::kFormat, "{}: SentencePiece model without pieces", file);
  if (model_type != kModelTypeBpe) {
    fail(ErrorKind::kUnsupported, "{}: SentencePiece model type {} (only BPE, 2, is supported)",
         file, model_type);
  }
  if (normalizer != "identity") {
    log_warn("{}: normalizer '{}' is not applied (text is tokenized as given)", file, normalizer);
  }
  t->unk = checked_id(file, "unk_id", unk, n);
  t->bos = checked_id(file, "bos_id", bos, n);
  t->eos = checked_id(file, "eos_id", eos, n);
  t->add_bos = true;
  t->add_space_prefix = add_dummy_prefix;
  t->finish("", kNoToken);
  return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::load(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (path.extension() == ".model") return from_sentencepiece_file(path);
    if (path.extension() == ".json") return from_hf_json(path);
    return from_gguf_file(path);
  }
  Tokenizer tok = [&] {
    const fs::path sp = path / "tokenizer.model", hf = path / "tokenizer.json";
    if (fs::exists(sp, ec)) return from_sentencepiece_file(sp);
    if (fs::exists(hf, ec)) return from_hf_json(hf);
    if (fs::exists(path / "tiktoken.model", ec)) return from_tiktoken(path);
    fail(ErrorKind::kIo, "{}: no tokenizer.model, tokenizer.json or tiktoken.model",
         path.string());
  }();
  // tokenizer_config.json names the BOS/EOS tokens and whether they are added.
  const fs::path config = path / "tokenizer_config.json";
  if (!fs::exists(config, ec)) return tok;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(config));
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kFormat, "{}: {}", config.string(), e.what());
  }
  auto token_named = [&](const char* key) -> TokenId {
    if (!j.contains(key)) return kNoToken;
    const nlohmann::json& v = j[key];
    std::string text;
    if (v.is_string()) text = v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) text = v["content"];
    return text.empty() ? kNoToken : tok.impl_->find(text);
  };
  if (TokenId id = token_named("bos_token"); id != kNoToken) tok.impl_->bos = id;
  if (TokenId id = token_named("eos_token"); id != kNoToken) {
    tok.impl_->eos = id;
    auto& eog = tok.impl_->eog;
    if (!std::binary_search(eog.begin(), eog.end(), id)) {
      eog.insert(std::upper_bound(eog.begin(), eog.end(), id), id);
    }
  }
  if (j.contains("add_bos_token") && j["add_bos_token"].is_boolean()) {
    tok.impl_->add_bos = j["add_bos_token"].get<bool>();
  }
  if (j.contains("add_eos_token") && j["add_eos_token"].is_boolean()) {
    tok.impl_->add_eos = j["add_eos_token"].get<bool>();
  }
  return tok;
}

}  // namespace tandem
