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

std::vector<TokenId> render_chat(const ChatTemplate& tmpl, const Tokenizer& tok,
                                 const jinja::Json& messages, bool add_generation_prompt) {
  const TokenId bos = tok.bos_id(), eos = tok.eos_id();
  const std::string bos_text = bos == kNoToken ? "" : tok.token_text(bos);
  const std::string eos_text = eos == kNoToken ? "" : tok.token_text(eos);
  const std::string text =
      tmpl.render(messages, nullptr, add_generation_prompt, bos_text, eos_text);
  std::vector<TokenId> ids = tok.encode(text, /*add_special=*/false, /*parse_special=*/true);
  if (tok.add_bos() && bos != kNoToken && (ids.empty() || ids.front() != bos)) {
    ids.insert(ids.begin(), bos);
  }
  return ids;
}

}  // namespace tandem
