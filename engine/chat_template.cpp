#include "engine/chat_template.h"

#include <filesystem>

#include "core/error.h"
#include "core/input_file.h"
#include "formats/gguf.h"

namespace tandem {

ChatTemplate::ChatTemplate(std::string source, std::string name)
    : source_(std::move(source)), template_(source_, std::move(name)) {}

ChatTemplate ChatTemplate::from_gguf(const GgufFile& gguf) {
  const GgufValue* v = gguf.find("tokenizer.chat_template");
  if (!v) fail(ErrorKind::kFormat, "{}: no tokenizer.chat_template in the metadata", gguf.path());
  return ChatTemplate(v->as_string(), gguf.path() + ":tokenizer.chat_template");
}

static std::string read_text(const std::string& path) {
  return read_input_file(path, kMaxConfigFileBytes);
}

ChatTemplate ChatTemplate::from_hf_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::string jinja_path = (fs::path(dir) / "chat_template.jinja").string();
  if (fs::exists(jinja_path)) return ChatTemplate(read_text(jinja_path), jinja_path);
  std::string config_path = (fs::path(dir) / "tokenizer_config.json").string();
  jinja::Json config;
  try {
    config = jinja::Json::parse(read_text(config_path));
  } catch (const jinja::Json::exception& e) {
    fail(ErrorKind::kFormat, "{}: {}", config_path, e.what());
  }
  auto it = config.find("chat_template");
  if (it == config.end()) fail(ErrorKind::kFormat, "{}: no \"chat_template\" key", config_path);
  if (it->is_string()) return ChatTemplate(it->get<std::string>(), config_path);
  if (it->is_array()) {
    for (const auto& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return ChatTemplate(entry["template"].get<std::string>(), config_path);
      }
    }
  }
  fail(ErrorKind::kFormat, "{}: \"chat_template\" is neither a string nor a list with a default",
       config_path);
}

std::string ChatTemplate::render(const jinja::Json& messages, const jinja::Json& tools,
                                 bool add_generation_prompt, const std::string& bos_token,
                                 const std::string& eos_token, const jinja::Json& extra,
                                 const jinja::RenderLimits& limits) const {
  using jinja::Value;
  Value globals = Value::object();
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) globals.set(it.key(), jinja::from_json(it.value()));
  }
  globals.set("messages", jinja::from_json(messages));
  // As transformers' render_jinja_template: `tools` and `documents` are None when absent.
  globals.set("tools", jinja::from_json(tools));
  globals.set("documents", Value::none());
  globals.set("add_generation_prompt", Value::boolean(add_generation_prompt));
  globals.set("bos_token", Value::string(bos_token));
  globals.set("eos_token", Value::string(eos_token));
  globals.set("raise_exception", Value::function([](std::vector<Value>& args, jinja::KwArgs&) -> Value {
    // The template's own message, unprefixed: it is meant for the user.
    fail(ErrorKind::kInvalidArgument, "{}", args.empty() ? std::string() : jinja::to_str(args[0]));
  }));
  std::optional<std::tm> fixed = now_;
  globals.set("strftime_now", Value::function([fixed](std::vector<Value>& args, jinja::KwArgs&) {
    std::tm tm{};
    if (fixed) {
      tm = *fixed;
    } else {
      std::time_t t = std::time(nullptr);
      localtime_r(&t, &tm);
    }
    std::string fmt = args.empty() ? std::string() : jinja::to_str(args[0]);
    char buf[512];
    size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
    return Value::string(std::string(buf, n));
  }));
  return template_.render(globals, limits);
}

}  // namespace tandem
