#include "engine/chat.h"

#include "core/error.h"
#include "formats/gguf.h"

namespace tandem {

ChatTemplate chat_template_for(const LoadedModel& model) {
  if (model.gguf) {
    if (!model.gguf->find("tokenizer.chat_template")) {
      fail(ErrorKind::kUnsupported, "{}: the model has no chat template (tokenizer.chat_template)",
           model.path.string());
    }
    return ChatTemplate::from_gguf(*model.gguf);
  }
  return ChatTemplate::from_hf_dir(model.path.string());
}

ChatPrompt render_chat_prompt(const ChatTemplate& tmpl, const Tokenizer& tok,
                              const jinja::Json& messages, bool add_generation_prompt,
                              const jinja::Json& tools, const jinja::Json& extra) {
  const TokenId bos = tok.bos_id(), eos = tok.eos_id();
  const std::string bos_text = bos == kNoToken ? "" : tok.token_text(bos);
  const std::string eos_text = eos == kNoToken ? "" : tok.token_text(eos);
  ChatPrompt p;
  p.text = tmpl.render(messages, tools, add_generation_prompt, bos_text, eos_text, extra);
  p.ids = tok.encode(p.text, /*add_special=*/false, /*parse_special=*/true);
  if (tok.add_bos() && bos != kNoToken && (p.ids.empty() || p.ids.front() != bos)) {
    p.ids.insert(p.ids.begin(), bos);
  }
  return p;
}

std::vector<TokenId> render_chat(const ChatTemplate& tmpl, const Tokenizer& tok,
                                 const jinja::Json& messages, bool add_generation_prompt) {
  return render_chat_prompt(tmpl, tok, messages, add_generation_prompt).ids;
}

}  // namespace tandem
