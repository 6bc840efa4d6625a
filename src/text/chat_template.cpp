// Chat templates as transformers loads and applies them (tokenization_utils_base.py: the template
// file lookup, special_tokens_map, render_jinja_template's variables).
#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsinfer/error.h"

namespace dsi {

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  DSI_CHECK(f.good(), "cannot read {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const std::filesystem::path& p) {
  const std::string text = read_file(p);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", p.string(), e.what());
  }
}

// tokenizer_config.json's chat_template: a string, or a list of named templates ("default" is used).
std::string template_from_config(const nlohmann::json& t, const std::string& where) {
  if (t.is_string()) return t.get<std::string>();
  DSI_CHECK(t.is_array(), "{}: chat_template must be a string or a list of named templates, got {}", where,
            t.type_name());
  std::string names;
  for (const auto& e : t) {
    DSI_CHECK(e.is_object() && e.contains("name") && e.contains("template") && e["template"].is_string(),
              "{}: each chat_template entry needs a \"name\" and a string \"template\"", where);
    if (e["name"] == "default") return e["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + e["name"].dump();
  }
  fail("{}: chat_template has no template named \"default\" (it has {})", where, names.empty() ? "none" : names);
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::string& model_dir, jinja::Options opt) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const fs::path config_path = dir / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (fs::exists(config_path)) config = read_json(config_path);
  DSI_CHECK(config.is_object(), "{}: expected a JSON object", config_path.string());

  std::string source, where;
  if (fs::exists(dir / "chat_template.jinja")) {
    where = (dir / "chat_template.jinja").string();
    source = read_file(where);
  } else if (fs::exists(dir / "chat_template.json")) {
    where = (dir / "chat_template.json").string();
    const nlohmann::json j = read_json(where);
    DSI_CHECK(j.is_object() && j.contains("chat_template"), "{}: no \"chat_template\" key", where);
    source = template_from_config(j["chat_template"], where);
  } else {
    where = config_path.string();
    DSI_CHECK(config.contains("chat_template"),
              "{}: no chat template (no chat_template.jinja, chat_template.json or tokenizer_config.json "
              "\"chat_template\")",
              model_dir);
    source = template_from_config(config["chat_template"], where);
  }

  // special_tokens_map: the named special tokens that are set, as strings.
  std::map<std::string, std::string> special;
  for (const char* name :
       {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(name) || config[name].is_null()) continue;
    const nlohmann::json& t = config[name];
    if (t.is_string()) {
      special[name] = t.get<std::string>();
    } else if (t.is_object() && t.contains("content") && t["content"].is_string()) {
      special[name] = t["content"].get<std::string>();
    } else {
      fail("{}: {} must be a string or an AddedToken object, got {}", config_path.string(), name, t.dump());
    }
  }
  return ChatTemplate(source, std::move(special), where, std::move(opt));
}

ChatTemplate::ChatTemplate(const std::string& source, std::map<std::string, std::string> special_tokens,
                           const std::string& name, jinja::Options opt)
    : source_(source),
      special_tokens_(std::move(special_tokens)),
      template_(std::make_shared<const jinja::Template>(source, name, std::move(opt))) {}

std::string ChatTemplate::bos_token() const {
  auto it = special_tokens_.find("bos_token");
  return it == special_tokens_.end() ? "" : it->second;
}

std::string ChatTemplate::eos_token() const {
  auto it = special_tokens_.find("eos_token");
  return it == special_tokens_.end() ? "" : it->second;
}

std::string ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                 bool add_generation_prompt, const nlohmann::json& extra_kwargs) const {
  return render_impl(messages, tools, add_generation_prompt, extra_kwargs);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra_kwargs) const {
  return render_impl(messages, tools, add_generation_prompt, extra_kwargs);
}

template <typename Json>
std::string ChatTemplate::render_impl(const Json& messages, const Json& tools, bool add_generation_prompt,
                                      const Json& extra_kwargs) const {
  const std::string& where = template_->name();
  DSI_CHECK(messages.is_array(), "{}: messages must be a JSON array, got {}", where, messages.type_name());
  DSI_CHECK(tools.is_null() || tools.is_array(), "{}: tools must be null or a JSON array, got {}", where,
            tools.type_name());
  DSI_CHECK(extra_kwargs.is_null() || extra_kwargs.is_object(), "{}: extra template kwargs must be a JSON object, got {}",
            where, extra_kwargs.type_name());
  jinja::Dict vars;
  for (const auto& [k, v] : special_tokens_) vars.set(k, jinja::Value(v));
  if (extra_kwargs.is_object()) {
    for (const auto& [k, v] : extra_kwargs.items()) {
      DSI_CHECK(k != "messages" && k != "tools" && k != "documents" && k != "add_generation_prompt",
                "{}: template kwarg '{}' is reserved", where, k);
      vars.set(k, jinja::from_json(v));
    }
  }
  vars.set("messages", jinja::from_json(messages));
  vars.set("tools", jinja::from_json(tools));
  vars.set("documents", jinja::Value::none());
  vars.set("add_generation_prompt", jinja::Value(add_generation_prompt));
  return template_->render(vars);
}

}  // namespace dsi
