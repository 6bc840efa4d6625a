// config.json parsing and validation; see config.h. Defaults follow the HF config classes where a
// released checkpoint may omit a field; geometry fields are required.
#include "model/config.h"

#include <cmath>
#include <limits>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dsinfer/error.h"

namespace dsi {

using json = nlohmann::json;

namespace {

// A string value from the file as an error message shows it: control characters (newlines
// included) escaped as JSON writes them, so the message stays one line.
std::string shown(const std::string& v) {
  const std::string quoted = nlohmann::json(v).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

class Reader {
 public:
  Reader(const json& j, const std::string& source) : j_(j), src_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  int64_t int_req(const char* key, int64_t min_value = 1) const {
    DSI_CHECK(has(key), "{}: missing required field '{}'", src_, key);
    return checked_int(j_.at(key), key, min_value);
  }
  int64_t int_opt(const char* key, int64_t def, int64_t min_value = 0) const {
    return has(key) ? checked_int(j_.at(key), key, min_value) : def;
  }
  double num_opt(const char* key, double def) const {
    if (!has(key)) return def;
    DSI_CHECK(j_.at(key).is_number(), "{}: field '{}' must be a number, got {}", src_, key,
              j_.at(key).dump());
    return j_.at(key).get<double>();
  }
  bool bool_opt(const char* key, bool def) const {
    if (!has(key)) return def;
    DSI_CHECK(j_.at(key).is_boolean(), "{}: field '{}' must be true or false, got {}", src_, key,
              j_.at(key).dump());
    return j_.at(key).get<bool>();
  }
  std::string str_opt(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    DSI_CHECK(j_.at(key).is_string(), "{}: field '{}' must be a string, got {}", src_, key,
              j_.at(key).dump());
    return j_.at(key).get<std::string>();
  }
  const json& at(const char* key) const { return j_.at(key); }
  const std::string& src() const { return src_; }

 private:
  // Every integer field is a size or a count: it must fit an int32 (the model's fields are int).
  int64_t checked_int(const json& v, const char* key, int64_t min_value) const {
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
    const bool whole_float = v.is_number_float() && std::floor(v.get<double>()) == v.get<double>();
    DSI_CHECK(v.is_number_integer() || whole_float, "{}: field '{}' must be an integer, got {}",
              src_, key, v.dump());
    // Range-check before converting: a float past int64 (1e300) has no integer value.
    const bool in_range = v.is_number_unsigned()  ? v.get<uint64_t>() <= uint64_t(kMax)
                          : v.is_number_integer() ? v.get<int64_t>() <= kMax
                                                  : std::fabs(v.get<double>()) <= double(kMax);
    DSI_CHECK(in_range, "{}: field '{}' = {} is too large (at most {})", src_, key, v.dump(), kMax);
    const int64_t x = v.is_number_integer() ? v.get<int64_t>() : int64_t(v.get<double>());
    DSI_CHECK(x >= min_value, "{}: field '{}' = {} must be >= {}", src_, key, x, min_value);
    return x;
  }
  const json& j_;
  std::string src_;
};

// rope_parameters (HF v5) or rope_theta + rope_scaling (released checkpoints).
RopeConfig parse_rope(const Reader& r, int64_t max_pos) {
  RopeConfig rope;
  const std::string& src = r.src();
  json params = json::object();
  if (r.has("rope_parameters")) {
    params = r.at("rope_parameters");
    DSI_CHECK(params.is_object(), "{}: 'rope_parameters' must be an object", src);
  } else if (r.has("rope_scaling")) {
    params = r.at("rope_scaling");
    DSI_CHECK(params.is_object(), "{}: 'rope_scaling' must be an object", src);
  }
  Reader p(params, src + " (rope)");
  rope.theta = p.has("rope_theta") ? p.num_opt("rope_theta", 0) : r.num_opt("rope_theta", 10000.0);
  DSI_CHECK(rope.theta > 1.0, "{}: rope_theta = {} must be > 1", src, rope.theta);
  rope.type = p.str_opt("rope_type", p.str_opt("type", "default"));
  if (rope.type == "default") return rope;
  DSI_CHECK(rope.type == "yarn", "{}: unsupported rope type '{}' (supported: default, yarn)", src,
            shown(rope.type));
  rope.original_max_position_embeddings =
      p.int_opt("original_max_position_embeddings", r.int_opt("original_max_position_embeddings",
                                                               max_pos, 1),
                1);
  // HF: a missing factor is derived from the two context lengths.
  rope.factor = p.has("factor") ? p.num_opt("factor", 1.0)
                                : double(max_pos) / double(rope.original_max_position_embeddings);
  DSI_CHECK(rope.factor > 0, "{}: rope factor = {} must be > 0", src, rope.factor);
  rope.beta_fast = p.num_opt("beta_fast", 32.0);
  rope.beta_slow = p.num_opt("beta_slow", 1.0);
  // HF treats 0 / null like absent ("x or 32").
  if (rope.beta_fast == 0) rope.beta_fast = 32.0;
  if (rope.beta_slow == 0) rope.beta_slow = 1.0;
  rope.mscale = p.num_opt("mscale", 0.0);
  rope.mscale_all_dim = p.num_opt("mscale_all_dim", 0.0);
  if (p.has("attention_factor")) rope.attention_factor = p.num_opt("attention_factor", 1.0);
  rope.truncate = p.bool_opt("truncate", true);
  return rope;
}

// Per-layer indexer mode: indexer_types, else index_topk_pattern, else the freq/offset schedule.
std::vector<bool> parse_indexer_types(const Reader& r, int n_layers) {
  const std::string& src = r.src();
  std::vector<bool> full(static_cast<size_t>(n_layers), true);
  auto from_names = [&](const json& list, const char* field) {
    DSI_CHECK(list.is_array() && int(list.size()) == n_layers,
              "{}: '{}' must be a list of {} entries (one per layer)", src, field, n_layers);
    for (int i = 0; i < n_layers; ++i) {
      const json& v = list[size_t(i)];
      std::string s = v.is_string() ? v.get<std::string>() : "";
      if (s == "F") s = "full";
      if (s == "S") s = "shared";
      DSI_CHECK(s == "full" || s == "shared", "{}: {}[{}] = {} must be \"full\" or \"shared\"", src,
                field, i, v.dump());
      full[size_t(i)] = s == "full";
    }
  };
  if (r.has("indexer_types")) {
    from_names(r.at("indexer_types"), "indexer_types");
  } else if (r.has("index_topk_pattern")) {
    const json& pat = r.at("index_topk_pattern");
    if (pat.is_string()) {
      json list = json::array();
      for (char c : pat.get<std::string>()) list.push_back(std::string(1, c));
      from_names(list, "index_topk_pattern");
    } else {
      from_names(pat, "index_topk_pattern");
    }
  } else {
    // Released GLM-5.2 layout: layer i is full iff max(i - offset + 1, 0) % freq == 0.
    const int64_t freq = std::max<int64_t>(r.int_opt("index_topk_freq", 1, 0), 1);
    const int64_t offset = r.int_opt("index_skip_topk_offset", 2, 0);
    for (int i = 0; i < n_layers; ++i)
      full[size_t(i)] = std::max<int64_t>(i - offset + 1, 0) % freq == 0;
  }
  DSI_CHECK(n_layers == 0 || full[0], "{}: layer 0 must have its own indexer (\"full\"): a "
            "\"shared\" layer reuses the previous full layer's top-k", src);
  return full;
}

std::vector<bool> parse_mlp_types(const Reader& r, int n_layers) {
  const std::string& src = r.src();
  std::vector<bool> moe(static_cast<size_t>(n_layers));
  if (r.has("mlp_layer_types")) {
    const json& list = r.at("mlp_layer_types");
    DSI_CHECK(list.is_array() && int(list.size()) == n_layers,
              "{}: 'mlp_layer_types' must be a list of {} entries", src, n_layers);
    for (int i = 0; i < n_layers; ++i) {
      const json& v = list[size_t(i)];
      std::string s = v.is_string() ? v.get<std::string>() : "";
      DSI_CHECK(s == "dense" || s == "sparse",
                "{}: mlp_layer_types[{}] = {} must be \"dense\" or \"sparse\"", src, i, v.dump());
      moe[size_t(i)] = s == "sparse";
    }
    return moe;
  }
  const int64_t dense = r.int_opt("first_k_dense_replace", 3, 0);
  const int64_t freq = r.int_opt("moe_layer_freq", 1, 1);
  DSI_CHECK(freq == 1, "{}: moe_layer_freq = {} is not supported (only 1)", src, freq);
  for (int i = 0; i < n_layers; ++i) moe[size_t(i)] = i >= dense;
  return moe;
}

}  // namespace

double ModelConfig::attn_softmax_scale() const {
  double scale = 1.0 / std::sqrt(double(qk_head_dim()));
  if (rope.is_yarn() && rope.mscale_all_dim != 0.0 && rope.factor > 1.0) {
    const double m = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

ModelConfig parse_config(const json& j, const std::string& source) {
  DSI_CHECK(j.is_object(), "{}: config must be a JSON object", source);
  Reader r(j, source);
  ModelConfig c;
  c.model_type = r.str_opt("model_type", "");
  if (c.model_type == "glm_moe_dsa") {
    c.family = ModelFamily::kGlmMoeDsa;
  } else if (c.model_type == "deepseek_v32") {
    c.family = ModelFamily::kDeepseekV32;
  } else {
    fail("{}: unsupported model_type '{}' (supported: glm_moe_dsa, deepseek_v32)", source,
         shown(c.model_type));
  }
  const bool glm = c.family == ModelFamily::kGlmMoeDsa;

  c.vocab_size = r.int_req("vocab_size");
  c.hidden_size = r.int_req("hidden_size");
  c.intermediate_size = r.int_req("intermediate_size");
  c.moe_intermediate_size = r.int_req("moe_intermediate_size");
  c.n_layers = int(r.int_req("num_hidden_layers"));
  c.n_heads = int(r.int_req("num_attention_heads"));
  c.q_lora_rank = int(r.int_req("q_lora_rank"));
  c.kv_lora_rank = int(r.int_req("kv_lora_rank"));
  c.head_dim_nope = int(r.int_req("qk_nope_head_dim"));
  c.head_dim_rope = int(r.int_req("qk_rope_head_dim"));
  c.v_head_dim = int(r.int_req("v_head_dim"));
  c.n_index_heads = int(r.int_req("index_n_heads"));
  c.index_head_dim = int(r.int_req("index_head_dim"));
  c.index_topk = int(r.int_req("index_topk"));
  c.n_experts = int(r.int_req("n_routed_experts"));
  c.n_experts_active = int(r.int_req("num_experts_per_tok"));
  c.n_shared_experts = int(r.int_opt("n_shared_experts", 1, 0));
  c.n_group = int(r.int_opt("n_group", 1, 1));
  c.topk_group = int(r.int_opt("topk_group", 1, 1));
  c.norm_topk_prob = r.bool_opt("norm_topk_prob", true);
  c.routed_scaling_factor = r.num_opt("routed_scaling_factor", 2.5);
  c.rms_norm_eps = r.num_opt("rms_norm_eps", glm ? 1e-5 : 1e-6);
  c.max_position_embeddings = r.int_opt("max_position_embeddings", glm ? 202752 : 163840, 1);
  c.tie_word_embeddings = r.bool_opt("tie_word_embeddings", false);
  c.index_share_for_mtp_iteration = r.bool_opt("index_share_for_mtp_iteration", false);
  c.n_mtp_layers = int(r.int_opt("num_nextn_predict_layers", -1, 0));

  const std::string act = r.str_opt("hidden_act", "silu");
  DSI_CHECK(act == "silu", "{}: hidden_act '{}' is not supported (only silu)", source, shown(act));
  DSI_CHECK(!r.bool_opt("attention_bias", false), "{}: attention_bias = true is not supported",
            source);
  DSI_CHECK(c.head_dim_rope % 2 == 0, "{}: qk_rope_head_dim = {} must be even", source,
            c.head_dim_rope);
  DSI_CHECK(c.index_head_dim >= c.head_dim_rope,
            "{}: index_head_dim = {} must be >= qk_rope_head_dim = {}", source, c.index_head_dim,
            c.head_dim_rope);
  DSI_CHECK(c.n_experts % c.n_group == 0, "{}: n_routed_experts = {} must be divisible by n_group = {}",
            source, c.n_experts, c.n_group);
  DSI_CHECK(c.topk_group <= c.n_group, "{}: topk_group = {} must be <= n_group = {}", source,
            c.topk_group, c.n_group);
  DSI_CHECK(c.n_experts_active <= c.topk_group * (c.n_experts / c.n_group),
            "{}: num_experts_per_tok = {} exceeds the experts of the kept groups ({})", source,
            c.n_experts_active, c.topk_group * (c.n_experts / c.n_group));
  DSI_CHECK(c.n_group == 1 || c.n_experts / c.n_group >= 2,
            "{}: grouped routing needs at least 2 experts per group", source);

  c.rope = parse_rope(r, c.max_position_embeddings);
  c.indexer_full = parse_indexer_types(r, c.n_layers);
  c.layer_is_moe = parse_mlp_types(r, c.n_layers);
  const bool interleave = r.bool_opt("indexer_rope_interleave", glm);
  c.indexer_rope_style = interleave ? RopeStyle::kInterleaved : RopeStyle::kHalfSplit;

  if (r.has("eos_token_id")) {
    const json& e = r.at("eos_token_id");
    if (e.is_array()) {
      for (const json& v : e) {
        DSI_CHECK(v.is_number_integer(), "{}: eos_token_id entries must be integers", source);
        c.eos_token_ids.push_back(v.get<int64_t>());
      }
    } else {
      DSI_CHECK(e.is_number_integer(), "{}: eos_token_id must be an integer or a list", source);
      c.eos_token_ids.push_back(e.get<int64_t>());
    }
  }

  if (r.has("quantization_config")) {
    const json& q = r.at("quantization_config");
    DSI_CHECK(q.is_object(), "{}: quantization_config must be an object", source);
    Reader qr(q, source + " (quantization_config)");
    const std::string method = qr.str_opt("quant_method", "");
    DSI_CHECK(method == "fp8",
              "{}: quantization method '{}' is not supported (supported: fp8 block-scaled)", source,
              shown(method));
    const std::string fmt_name = qr.str_opt("fmt", "e4m3");
    DSI_CHECK(fmt_name == "e4m3", "{}: fp8 format '{}' is not supported (only e4m3)", source,
              shown(fmt_name));
    c.quant.fp8 = true;
    if (qr.has("weight_block_size")) {
      const json& b = q.at("weight_block_size");
      DSI_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() &&
                    b[1].is_number_integer() && b[0].get<int>() > 0 && b[1].get<int>() > 0,
                "{}: weight_block_size must be two positive integers, got {}", source, b.dump());
      c.quant.block_out = b[0].get<int>();
      c.quant.block_in = b[1].get<int>();
    }
  }
  return c;
}

ModelConfig load_config(const std::string& path) {
  std::ifstream f(path);
  DSI_CHECK(f.good(), "{}: cannot open config file", path);
  std::stringstream ss;
  ss << f.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  DSI_CHECK(!j.is_discarded(), "{}: not valid JSON", path);
  return parse_config(j, path);
}

}  // namespace dsi
