// What `tandem chat` and `tandem run --chat` share: the model's own chat template, rendered over a
// conversation and tokenized the way llama.cpp does it (special-token text in the rendered
// template is parsed; BOS is added when the vocabulary asks for it and the template did not).
#pragma once

#include <string>
#include <vector>

#include "engine/chat_template.h"
#include "engine/tokenizer.h"
#include "model/weights.h"

namespace tandem {

// The template of a GGUF file (`tokenizer.chat_template`) or an HF directory
// (chat_template.jinja / tokenizer_config.json). Throws Error naming the model when it has none.
ChatTemplate chat_template_for(const LoadedModel& model);

// messages: [{"role": "system"|"user"|"assistant", "content": "..."}]
std::vector<TokenId> render_chat(const ChatTemplate& tmpl, const Tokenizer& tok,
                                 const jinja::Json& messages, bool add_generation_prompt);

// The rendered text and its tokens. tools: the template's `tools` (null: none); the members of
// `extra` become further template variables (chat_template_kwargs, e.g. enable_thinking).
struct ChatPrompt {
  std::string text;
  std::vector<TokenId> ids;
};
ChatPrompt render_chat_prompt(const ChatTemplate& tmpl, const Tokenizer& tok,
                              const jinja::Json& messages, bool add_generation_prompt,
                              const jinja::Json& tools = nullptr,
                              const jinja::Json& extra = jinja::Json::object());

}  // namespace tandem
