// What the API files share beyond the fields (server/request_fields.h): a conversation in chat's
// shape rendered into a request's prompt, and an answer taken apart as it streams. The Responses
// and Messages APIs turn their input into chat's shape and their output from these parts.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/chat_output.h"
#include "server/openai.h"

namespace tandem::server {

// The tools offered for a tool choice: "none" (null), "auto" / "required" / "" (all), or a
// tool's name (that tool only; 400 when it is not among them). Tools in chat's shape.
Json chosen_tools(Json tools, const std::string& choice);
// A conversation rendered into r's prompt with the model's chat template: `messages` in chat's
// shape (checked here), `tools` in chat's shape or null, `extra` the template's keyword arguments;
// sets how the answer is parsed (reasoning, the tool-call syntax).
void render_conversation(const Json& messages, const Json& tools, const Json& extra,
                         const ModelInfo& model, ApiRequest* r);

// One answer (n = 1) as its events come: its pieces in order as they become final (the
// reasoning, the content, each tool call's start and its arguments as they are read), and at
// the end why it ended.
class AnswerParts {
 public:
  explicit AnswerParts(const ApiRequest& request);
  struct Step {
    AnswerDelta pieces;
    bool last = false;
    FinishReason finish = FinishReason::kNone;
    std::string stop;   // the stop string that ended it
    std::string error;  // kError
  };
  Step push(const GenerateEvent& ev);

 private:
  ChatStreamParser parser_;
};

// A writer of one conversational answer (the Responses and Messages APIs). The whole answer is
// built by taking it apart as it would stream (the events made and dropped), so a stream
// assembles into exactly the whole answer.
class AnswerWriter : public ResponseWriter {
 public:
  explicit AnswerWriter(const ApiRequest& request) : parts_(request) {}
  void add(const Job::Event& e) override { stream_event(e); }

 protected:
  AnswerParts parts_;
  FinishReason finish_ = FinishReason::kNone;
};

std::unique_ptr<ResponseWriter> make_responses_writer(const ApiRequest& request,
                                                      const ModelInfo& model, uint64_t serial,
                                                      int64_t created);
std::unique_ptr<ResponseWriter> make_messages_writer(const ApiRequest& request,
                                                     const ModelInfo& model, uint64_t serial,
                                                     int64_t created);

}  // namespace tandem::server
