// dsinfer_fake_server: the real server (src/server/) over the engine's test double, for the live
// API tests of what a real model cannot be made to do on cue, and to run them without the engine.
// Usage: dsinfer_fake_server --model DIR --port N [--host H] [--tokens-per-step K] [--step-us U]
//                            [--max-model-len L]
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>

#include "fake_engine.h"
#include "server/serve.h"

int main(int argc, char** argv) {
  std::string model_dir;
  dsi::server::HttpServerOptions http;
  dsi::test::FakeEngineOptions o;
  try {
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--model") model_dir = v;
      else if (k == "--port") http.port = std::stoi(v);
      else if (k == "--host") http.host = v;
      else if (k == "--tokens-per-step") o.tokens_per_step = std::stoi(v);
      else if (k == "--step-us") o.step_time = std::chrono::microseconds(std::stoi(v));
      else if (k == "--max-model-len") o.max_model_len = std::stoi(v);
      else dsi::fail("unknown option {}", k);
    }
    if (model_dir.empty()) dsi::fail("--model DIR is required (for the tokenizer and chat template)");
    o.model_id = model_dir.substr(model_dir.find_last_of('/') + 1);
    dsi::test::FakeEngine engine(o);
    return dsi::server::serve(engine, dsi::Tokenizer::load(model_dir + "/tokenizer.json"),
                              dsi::server::load_chat_template(model_dir), http, {});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
