#include "engine/tool_call_reader.h"

#include "engine/text_scan.h"

namespace tandem {
namespace {

using jinja::Json;

constexpr size_t npos = std::string_view::npos;
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";

using text::is_space;
using text::trim;

// Whether the text at a point is what the syntax expects there: it is (kYes), it may still
// become it (kMore: the text ends first), or it is not (kNo).
enum class Match { kYes, kMore, kNo };

class Cursor {
 public:
  explicit Cursor(std::string_view s) : s_(s) {}
  size_t pos() const { return pos_; }
  void seek(size_t p) { pos_ = p; }
  std::string_view rest() const { return s_.substr(pos_); }
  void space() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }
  // t next (consumed).
  Match lit(std::string_view t) {
    const std::string_view r = rest();
    if (r.substr(0, t.size()) == t) {
      pos_ += t.size();
      return Match::kYes;
    }
    return t.substr(0, r.size()) == r ? Match::kMore : Match::kNo;
  }
  // The text before t (consumed with t). kMore: t is not there yet; *out is then the text that
  // can no longer turn out to be the start of t.
  Match until(std::string_view t, std::string_view* out) {
    const std::string_view r = rest();
    const size_t at = r.find(t);
    if (at == npos) {
      *out = r.substr(0, r.size() - text::held_tail(r, {t}));
      return Match::kMore;
    }
    *out = r.substr(0, at);
    pos_ += at + t.size();
    return Match::kYes;
  }
  // A JSON string next (consumed), decoded.
  Match string(std::string* out) {
    const std::string_view r = rest();
    if (r.empty()) return Match::kMore;
    if (r[0] != '"') return Match::kNo;
    for (size_t i = 1; i < r.size(); ++i) {
      if (r[i] == '\\') {
        ++i;
      } else if (r[i] == '"') {
        const Json j = Json::parse(r.substr(0, i + 1), nullptr, /*allow_exceptions=*/false);
        if (!j.is_string()) return Match::kNo;
        *out = j.get<std::string>();
        pos_ += i + 1;
        return Match::kYes;
      }
    }
    return Match::kMore;
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

// How far reading one call got: it was read whole (the cursor after it); the text ends inside it;
// the text there is not a call (the cursor where it began); a call whose name was read stopped
// following the syntax (the cursor where it stopped: what follows is text).
enum class Read { kCall, kMore, kNotCall, kBroke };

// A partial Match inside a call already listed is kMore, a mismatch kBroke.
Read inside(Match m) {
  return m == Match::kMore ? Read::kMore : Read::kBroke;
}
// Before the call is listed: kMore, or not a call.
Read before(Match m) {
  return m == Match::kMore ? Read::kMore : Read::kNotCall;
}

std::string arguments_text(const Json& args) {
  if (args.is_string()) return args.get<std::string>();
  if (args.is_null()) return "{}";
  return args.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Whether a JSON object comes next (the cursor on its '{').
Read json_object_next(Cursor& c) {
  c.space();
  const std::string_view r = c.rest();
  if (r.empty()) return Read::kMore;
  return r[0] == '{' ? Read::kCall : Read::kNotCall;
}

// A call's arguments written as a JSON object, at the cursor: compacted into call->arguments.
Read json_arguments(Cursor& c, ToolCall* call) {
  JsonPrefix a = compact_json_prefix(c.rest());
  call->arguments = std::move(a.text);
  if (a.end == 0) return Read::kMore;
  c.seek(c.pos() + a.end);
  return Read::kCall;
}

// --- syntaxes that write each parameter as text ---

bool is_string_parameter(const Json& tools, const std::string& name, const std::string& key) {
  if (!tools.is_array()) return false;
  for (const Json& t : tools) {
    const Json* f = t.contains("function") ? &t["function"] : &t;
    if (!f->is_object() || f->value("name", "") != name) continue;
    const Json* params = f->contains("parameters") ? &(*f)["parameters"] : nullptr;
    if (params == nullptr || !params->is_object() || !params->contains("properties")) continue;
    const Json& props = (*params)["properties"];
    if (props.is_object() && props.contains(key) && props[key].is_object() &&
        props[key].value("type", "") == "string") {
      return true;
    }
  }
  return false;
}

void append_escaped(std::string* out, std::string_view s) {
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (c < 0x20) {
          static const char* kHex = "0123456789abcdef";
          *out += "\\u00";
          *out += kHex[c >> 4];
          *out += kHex[c & 15];
        } else {
          *out += ch;
        }
    }
  }
}

// The arguments object of a call whose parameters are written as text, built as they are read.
class TextArguments {
 public:
  TextArguments(ToolCall* call, const Json& tools, bool strip_newlines)
      : call_(call), tools_(tools), strip_(strip_newlines) {
    call_->arguments = "{";
  }
  // A parameter whose value is `value`, all of it (whole) or what is final of it so far; a
  // string when string_hint is 1 or, at -1, when the tool's schema says so.
  void add(std::string_view key, std::string_view value, bool whole, int string_hint = -1) {
    std::string& a = call_->arguments;
    if (a.size() > 1) a += ',';
    a += Json(std::string(key)).dump(-1, ' ', false, Json::error_handler_t::replace);
    a += ':';
    // (Qwen3-Coder writes a value on lines of its own: one newline before and after it is not
    // part of it. A newline at the end of a part may be that last one.)
    if (strip_ && !value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (strip_ && !value.empty() && value.back() == '\n') value.remove_suffix(1);
    if (string_hint == 1 ||
        (string_hint < 0 && is_string_parameter(tools_, call_->name, std::string(key)))) {
      a += '"';
      append_escaped(&a, value);
      if (whole) a += '"';
      return;
    }
    if (!whole) return;  // (a value of another type is written once it is whole)
    Json v = Json::parse(value, nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded()) v = std::string(value);
    a += v.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  void close() {
    if (!closed_) call_->arguments += '}';
    closed_ = true;
  }

 private:
  ToolCall* call_;
  const Json& tools_;
  bool strip_;
  bool closed_ = false;
};

// Parameters `<open>KEY<key_end>VALUE<value_end>` until `call_end`, into args. Between
// parameters a call may end; `final` closes a call whose text stops there. With attr_end, an
// attribute follows the key up to it (DSML's string="true|false": a string, or JSON).
struct ParameterTags {
  std::string_view open, key_end, value_open, value_end, call_end, attr_end = {};
};

Read text_parameters(Cursor& c, const ParameterTags& tags, TextArguments* args, bool final) {
  while (true) {
    c.space();
    const Match end = c.lit(tags.call_end);
    if (end == Match::kYes) {
      args->close();
      return Read::kCall;
    }
    const Match open = c.lit(tags.open);
    if (open != Match::kYes) {
      if (end == Match::kNo && open == Match::kNo) {
        args->close();
        return Read::kBroke;
      }
      if (final) args->close();
      return Read::kMore;
    }
    std::string_view key, value, attr;
    if (c.until(tags.key_end, &key) != Match::kYes) return Read::kMore;
    if (!tags.attr_end.empty() && c.until(tags.attr_end, &attr) != Match::kYes) return Read::kMore;
    if (!tags.value_open.empty()) {
      c.space();
      const Match m = c.lit(tags.value_open);
      if (m == Match::kMore) return Read::kMore;
      if (m == Match::kNo) {
        args->close();
        return Read::kBroke;
      }
    }
    const Match v = c.until(tags.value_end, &value);
    args->add(trim(key), value, v == Match::kYes,
              attr == "true" ? 1 : attr == "false" ? 0 : -1);
    if (v != Match::kYes) return Read::kMore;
  }
}

// <tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>
Read qwen3_coder_call(Cursor& c, const Json& tools, bool final, std::vector<ToolCall>* calls) {
  c.space();
  Match m = c.lit("<tool_call>");
  if (m != Match::kYes) return before(m);
  c.space();
  std::string_view name;
  if ((m = c.lit("<function=")) != Match::kYes) return before(m);
  if ((m = c.until(">", &name)) != Match::kYes) return before(m);
  if (trim(name).empty()) return Read::kNotCall;
  calls->push_back({"", std::string(trim(name)), ""});
  TextArguments args(&calls->back(), tools, /*strip_newlines=*/true);
  const Read r = text_parameters(
      c, {"<parameter=", ">", "", "</parameter>", "</function>"}, &args, final);
  if (r != Read::kCall) return r;
  c.space();
  return (m = c.lit("</tool_call>")) == Match::kYes ? Read::kCall : inside(m);
}

// <tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>
Read glm_call(Cursor& c, const Json& tools, bool final, std::vector<ToolCall>* calls) {
  c.space();
  const Match m = c.lit("<tool_call>");
  if (m != Match::kYes) return before(m);
  const std::string_view r = c.rest();
  const size_t name_end = r.find_first_of("\n<");
  if (name_end == npos) return Read::kMore;
  const std::string_view name = trim(r.substr(0, name_end));
  if (name.empty()) return Read::kNotCall;
  calls->push_back({"", std::string(name), ""});
  c.seek(c.pos() + name_end);
  TextArguments args(&calls->back(), tools, /*strip_newlines=*/false);
  return text_parameters(c, {"<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                             "</tool_call>"},
                         &args, final);
}

// <invoke name="N">\n<parameter name="K">V</parameter>\n</invoke> (inside <minimax:tool_call>)
Read minimax_call(Cursor& c, const Json& tools, bool final, std::vector<ToolCall>* calls) {
  c.space();
  std::string_view name;
  Match m = c.lit("<invoke name=\"");
  if (m != Match::kYes) return before(m);
  if ((m = c.until("\">", &name)) != Match::kYes) return before(m);
  calls->push_back({"", std::string(name), ""});
  TextArguments args(&calls->back(), tools, /*strip_newlines=*/false);
  return text_parameters(c, {"<parameter name=\"", "\">", "", "</parameter>", "</invoke>"},
                         &args, final);
}

// <｜DSML｜invoke name="N">\n<｜DSML｜parameter name="K" string="true">V</｜DSML｜parameter>\n
// </｜DSML｜invoke> (inside <｜DSML｜function_calls>): MiniMax-M2's form, each value marked a
// string or JSON.
Read dsml_call(Cursor& c, const Json& tools, bool final, std::vector<ToolCall>* calls) {
  c.space();
  std::string_view name;
  Match m = c.lit("<｜DSML｜invoke name=\"");
  if (m != Match::kYes) return before(m);
  if ((m = c.until("\">", &name)) != Match::kYes) return before(m);
  calls->push_back({"", std::string(name), ""});
  TextArguments args(&calls->back(), tools, /*strip_newlines=*/false);
  return text_parameters(c,
                         {"<｜DSML｜parameter name=\"", "\" string=\"", "", "</｜DSML｜parameter>",
                          "</｜DSML｜invoke>", "\">"},
                         &args, final);
}

// --- syntaxes that write the arguments as JSON ---

// <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>. Streamed when the name comes first
// (as the templates write it); otherwise read whole once </tool_call> comes.
Read hermes_call(Cursor& c, std::vector<ToolCall>* calls) {
  c.space();
  Match m = c.lit("<tool_call>");
  if (m != Match::kYes) return before(m);
  const size_t body = c.pos();
  std::string name;
  const auto head = [&]() {
    Match h;
    for (std::string_view t : {"{", "\"name\"", ":"}) {
      c.space();
      if ((h = c.lit(t)) != Match::kYes) return h;
    }
    c.space();
    if ((h = c.string(&name)) != Match::kYes) return h;
    for (std::string_view t : {",", "\"arguments\"", ":", "{"}) {
      c.space();
      if ((h = c.lit(t)) != Match::kYes) return h;
    }
    c.seek(c.pos() - 1);  // (the arguments' '{')
    return Match::kYes;
  };
  m = head();
  if (m == Match::kMore) return Read::kMore;
  if (m == Match::kYes) {
    calls->push_back({"", name, ""});
    const Read r = json_arguments(c, &calls->back());
    if (r != Read::kCall) return r;
    c.space();
    if ((m = c.lit("}")) == Match::kMore) return Read::kMore;
    if (m == Match::kNo) {  // (more keys after the arguments: up to the end)
      std::string_view rest;
      return c.until("</tool_call>", &rest) == Match::kYes ? Read::kCall : Read::kMore;
    }
    c.space();
    return (m = c.lit("</tool_call>")) == Match::kYes ? Read::kCall : inside(m);
  }
  c.seek(body);
  std::string_view text;
  if ((m = c.until("</tool_call>", &text)) != Match::kYes) return before(m);
  const Json j = Json::parse(trim(text), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return Read::kNotCall;
  calls->push_back({"", j["name"].get<std::string>(),
                    arguments_text(j.contains("arguments") ? j["arguments"] : Json())});
  return Read::kCall;
}

// <｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (V3.1), or R1's
// <｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜>
Read deepseek_call(Cursor& c, bool r1, std::vector<ToolCall>* calls) {
  c.space();
  std::string_view name, type;
  Match m = c.lit(kDsCallBegin);
  if (m != Match::kYes) return before(m);
  if (r1) {
    if ((m = c.until(kDsSep, &type)) != Match::kYes) return before(m);
    if ((m = c.until("\n", &name)) != Match::kYes) return before(m);
    c.space();
    if ((m = c.lit("```json")) == Match::kMore) return Read::kMore;
  } else if ((m = c.until(kDsSep, &name)) != Match::kYes) {
    return before(m);
  }
  const Read next = json_object_next(c);
  if (next != Read::kCall) return next;
  calls->push_back({"", std::string(trim(name)), ""});
  const Read r = json_arguments(c, &calls->back());
  if (r != Read::kCall) return r;
  c.space();
  if (r1 && (m = c.lit("```")) == Match::kMore) return Read::kMore;
  c.space();
  return (m = c.lit(kDsCallEnd)) == Match::kYes ? Read::kCall : inside(m);
}

// <|tool_call_begin|>functions.N:I<|tool_call_argument_begin|>{...}<|tool_call_end|>
Read kimi_call(Cursor& c, std::vector<ToolCall>* calls) {
  c.space();
  std::string_view id;
  Match m = c.lit("<|tool_call_begin|>");
  if (m != Match::kYes) return before(m);
  if ((m = c.until("<|tool_call_argument_begin|>", &id)) != Match::kYes) return before(m);
  id = trim(id);
  std::string_view name = id;  // "functions.NAME:INDEX"
  if (name.substr(0, 10) == "functions.") name.remove_prefix(10);
  name = name.substr(0, name.rfind(':'));
  const Read next = json_object_next(c);
  if (next != Read::kCall) return next;
  calls->push_back({std::string(id), std::string(name), ""});
  const Read r = json_arguments(c, &calls->back());
  if (r != Read::kCall) return r;
  c.space();
  return (m = c.lit("<|tool_call_end|>")) == Match::kYes ? Read::kCall : inside(m);
}

// [TOOL_CALLS]N[CALL_ID]I[ARGS]{...} (Mistral Small 3.2)
Read mistral_args_call(Cursor& c, std::vector<ToolCall>* calls) {
  c.space();
  std::string_view head;
  Match m = c.lit("[TOOL_CALLS]");
  if (m != Match::kYes) return before(m);
  if ((m = c.until("[ARGS]", &head)) != Match::kYes) return before(m);
  const size_t id_at = head.find("[CALL_ID]");
  const std::string_view id = id_at == npos ? std::string_view() : head.substr(id_at + 9);
  const Read next = json_object_next(c);
  if (next != Read::kCall) return next;
  calls->push_back({std::string(trim(id)), std::string(trim(head.substr(0, id_at))), ""});
  return json_arguments(c, &calls->back());
}

// [TOOL_CALLS][{"name": N, "arguments": {...}, "id": I}, ...] (Mistral Nemo): the list is read
// whole (a call's id comes after its arguments).
Read mistral_list(Cursor& c, std::vector<ToolCall>* calls) {
  Match m = c.lit("[TOOL_CALLS]");
  if (m != Match::kYes) return before(m);
  c.space();
  const std::string_view r = c.rest();
  if (r.empty()) return Read::kMore;
  if (r[0] != '[') return Read::kNotCall;
  const JsonPrefix p = compact_json_prefix(r);
  if (p.end == 0) return Read::kMore;
  const Json list = Json::parse(p.text, nullptr, /*allow_exceptions=*/false);
  if (!list.is_array() || list.empty()) return Read::kNotCall;
  std::vector<ToolCall> read;
  for (const Json& x : list) {
    if (!x.is_object() || !x.contains("name") || !x["name"].is_string()) return Read::kNotCall;
    read.push_back({x.contains("id") && x["id"].is_string() ? x["id"].get<std::string>() : "",
                    x["name"].get<std::string>(),
                    arguments_text(x.contains("arguments") ? x["arguments"] : Json())});
  }
  calls->insert(calls->end(), read.begin(), read.end());
  c.seek(c.pos() + p.end);
  return Read::kCall;
}

// Calls one after another (`one` reads one from the cursor), until text that is not one.
template <class One>
void read_calls(Cursor& c, ToolCallsRead* out, One one) {
  while (true) {
    const size_t start = c.pos();
    const size_t listed = out->calls.size();
    switch (one(c)) {
      case Read::kCall:
        continue;
      case Read::kMore:
        out->end = out->calls.size() > listed ? npos : start;
        return;
      case Read::kNotCall:
        out->ended = true;
        out->end = start;
        return;
      case Read::kBroke:
        out->ended = true;
        out->end = c.pos();
        return;
    }
  }
}

// Calls between a section's open and close markers (the close may be missing).
template <class One>
void read_section(Cursor& c, std::string_view open, std::string_view close, ToolCallsRead* out,
                  One one) {
  const Match m = c.lit(open);
  if (m != Match::kYes) {
    out->ended = m == Match::kNo;
    return;
  }
  read_calls(c, out, [&](Cursor& k) {
    k.space();
    const size_t at = k.pos();
    const Match end = k.lit(close);
    if (end == Match::kYes) return Read::kBroke;  // (the section's end: text follows)
    const Read r = one(k);
    if (r == Read::kNotCall) {
      k.seek(at);
      if (end == Match::kMore) return Read::kMore;
    }
    return r;
  });
}

}  // namespace

JsonPrefix compact_json_prefix(std::string_view s) {
  JsonPrefix out;
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      out.text += c;
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (is_space(c)) continue;
    out.text += c;
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth <= 0) {
      out.end = i + 1;
      return out;
    }
  }
  return out;
}

ToolCallsRead read_tool_calls(std::string_view text, ToolCallSyntax syntax, const Json& tools,
                              bool final) {
  ToolCallsRead out;
  Cursor c(text);
  std::vector<ToolCall>* calls = &out.calls;
  switch (syntax) {
    case ToolCallSyntax::kNone:
    case ToolCallSyntax::kHarmony:
      out.ended = true;
      break;
    case ToolCallSyntax::kHermes:
      read_calls(c, &out, [&](Cursor& k) { return hermes_call(k, calls); });
      break;
    case ToolCallSyntax::kQwen3Coder:
      read_calls(c, &out, [&](Cursor& k) { return qwen3_coder_call(k, tools, final, calls); });
      break;
    case ToolCallSyntax::kGlm:
      read_calls(c, &out, [&](Cursor& k) { return glm_call(k, tools, final, calls); });
      break;
    case ToolCallSyntax::kMistralArgs:
      read_calls(c, &out, [&](Cursor& k) { return mistral_args_call(k, calls); });
      break;
    case ToolCallSyntax::kMistralList:
      read_calls(c, &out, [&](Cursor& k) { return mistral_list(k, calls); });
      break;
    case ToolCallSyntax::kDeepSeekV3:
    case ToolCallSyntax::kDeepSeekR1: {
      const bool r1 = syntax == ToolCallSyntax::kDeepSeekR1;
      read_section(c, kDsCallsBegin, kDsCallsEnd, &out,
                   [&](Cursor& k) { return deepseek_call(k, r1, calls); });
      break;
    }
    case ToolCallSyntax::kKimi:
      read_section(c, "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", &out,
                   [&](Cursor& k) { return kimi_call(k, calls); });
      break;
    case ToolCallSyntax::kMiniMax:
      read_section(c, "<minimax:tool_call>", "</minimax:tool_call>", &out,
                   [&](Cursor& k) { return minimax_call(k, tools, final, calls); });
      break;
    case ToolCallSyntax::kDsml:
    case ToolCallSyntax::kDsmlToolCalls: {  // (V3.2's section name, V4's)
      const bool v4 = syntax == ToolCallSyntax::kDsmlToolCalls;
      read_section(c, v4 ? "<｜DSML｜tool_calls>" : "<｜DSML｜function_calls>",
                   v4 ? "</｜DSML｜tool_calls>" : "</｜DSML｜function_calls>", &out,
                   [&](Cursor& k) { return dsml_call(k, tools, final, calls); });
      break;
    }
  }
  // (no call read: all of the text is text)
  if (out.calls.empty()) out.end = 0;
  return out;
}

}  // namespace tandem
