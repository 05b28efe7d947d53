// Chat templates: renders a model's own Jinja2 chat template (GGUF `tokenizer.chat_template`,
// or an HF directory's chat_template.jinja / tokenizer_config.json) the way Hugging Face's
// apply_chat_template does, with the engine of engine/jinja.h.
#pragma once

#include <ctime>
#include <optional>
#include <string>

#include "engine/jinja.h"

namespace tandem {

class GgufFile;

class ChatTemplate {
 public:
  // Parses `source`; throws Error(kFormat) "<name>:<line>:<col>: ..." when it cannot.
  explicit ChatTemplate(std::string source, std::string name = "chat_template");

  // From GGUF metadata `tokenizer.chat_template`; throws Error(kFormat) naming the file if absent.
  static ChatTemplate from_gguf(const GgufFile& gguf);
  // From an HF model directory: chat_template.jinja, else tokenizer_config.json's
  // "chat_template" (a string, or a list of {name, template} where "default" is taken).
  static ChatTemplate from_hf_dir(const std::string& dir);

  // Renders `messages` (a JSON array of {role, content, ...}) and `tools` (null: None, as
  // transformers passes it); the members of `extra` become further variables (e.g.
  // enable_thinking; the named arguments win over same-named extras). Throws Error
  // with the template's message for raise_exception, or line:column for other failures (a
  // render budget of `limits` included).
  std::string render(const jinja::Json& messages, const jinja::Json& tools,
                     bool add_generation_prompt, const std::string& bos_token,
                     const std::string& eos_token, const jinja::Json& extra = jinja::Json::object(),
                     const jinja::RenderLimits& limits = {}) const;

  // Fixes the time strftime_now() formats (tests); the default is the current local time.
  void set_now(std::tm now) { now_ = now; }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  jinja::Template template_;
  std::optional<std::tm> now_;
};

}  // namespace tandem
