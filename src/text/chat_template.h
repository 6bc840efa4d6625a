// dsi::ChatTemplate: a model's chat template rendered as HF transformers' apply_chat_template does
// (tokenize=False): the Jinja engine of jinja.h with messages, tools, documents=None,
// add_generation_prompt, the tokenizer's special tokens (bos_token, eos_token, ...) and any extra
// keyword arguments (enable_thinking, thinking, reasoning_effort, ...).
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "text/jinja.h"

namespace dsi {

class ChatTemplate {
 public:
  // Reads the template of a model directory as transformers does: chat_template.jinja if present,
  // else chat_template.json's "chat_template", else tokenizer_config.json's "chat_template" (a string,
  // or a list of {"name", "template"} from which "default" is taken). Special tokens (bos_token,
  // eos_token, unk_token, pad_token, ...) come from tokenizer_config.json, as strings or AddedToken
  // objects. Throws dsi::Error naming the file on a missing template or a template syntax error.
  static ChatTemplate load(const std::string& model_dir, jinja::Options opt = {});

  // A template from its source; special_tokens maps names ("bos_token") to token strings.
  ChatTemplate(const std::string& source, std::map<std::string, std::string> special_tokens,
               const std::string& name = "chat_template", jinja::Options opt = {});

  // messages: a JSON array of message objects; tools: null or an array of tool schemas (passed as
  // None when null, as HF does without tools); extra_kwargs: null or an object of further template
  // variables. Throws dsi::Error on a template error; raise_exception(msg) gives dsi::Error(msg).
  // Object key order reaches the template (tojson, dict.items()) as the JSON type keeps it: parse
  // requests as nlohmann::ordered_json to match Python, which keeps the request's order.
  std::string render(const nlohmann::json& messages, const nlohmann::json& tools = nullptr,
                     bool add_generation_prompt = true,
                     const nlohmann::json& extra_kwargs = nlohmann::json::object()) const;
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools = nullptr,
                     bool add_generation_prompt = true,
                     const nlohmann::ordered_json& extra_kwargs = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return source_; }
  const std::map<std::string, std::string>& special_tokens() const { return special_tokens_; }
  std::string bos_token() const;  // "" when the tokenizer has none
  std::string eos_token() const;

 private:
  template <typename Json>
  std::string render_impl(const Json& messages, const Json& tools, bool add_generation_prompt,
                          const Json& extra_kwargs) const;

  std::string source_;
  std::map<std::string, std::string> special_tokens_;
  std::shared_ptr<const jinja::Template> template_;  // immutable after parsing: copies share it
};

}  // namespace dsi
