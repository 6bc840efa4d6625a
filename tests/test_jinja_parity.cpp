// JinjaParity: dsi::jinja and dsi::ChatTemplate against Python jinja2 as HF transformers runs it.
// tests/jinja/oracle.py (the JinjaOracle.Setup ctest fixture, run_oracle.sh) renders every template of
// tests/jinja/templates/templates.json with every conversation and variant of conversations.json,
// and every case of engine_cases.json; here the same renders must give the same bytes, and must
// raise wherever jinja2 raised.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "dsinfer/error.h"
#include "test_util.h"
#include "text/chat_template.h"
#include "text/jinja.h"

namespace dsi::test {
namespace {

using Json = nlohmann::ordered_json;  // Python keeps object key order; so must the inputs here

Json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f.good()) return Json();
  return Json::parse(f);
}

const Json& oracle() {
  static const Json j = read_json(std::string(DSI_JINJA_ORACLE_DIR) + "/oracle.json");
  return j;
}

bool have_oracle() {
  if (!oracle().is_null()) return true;
  ADD_FAILURE() << "no jinja2 oracle output at " DSI_JINJA_ORACLE_DIR "/oracle.json: run the tests through "
                   "ctest (the JinjaOracle.Setup fixture), or run tests/jinja/run_oracle.sh " DSI_JINJA_ORACLE_DIR;
  return false;
}

// oracle.py's strftime_now date: 2025-03-07 13:05:09.
jinja::Options fixed_clock() {
  jinja::Options opt;
  opt.now = [] {
    std::tm t{};
    t.tm_year = 2025 - 1900, t.tm_mon = 2, t.tm_mday = 7, t.tm_hour = 13, t.tm_min = 5, t.tm_sec = 9;
    const std::time_t tt = timegm(&t);
    gmtime_r(&tt, &t);  // fills the weekday and day of year
    return t;
  };
  return opt;
}

// Where two renders first differ, with some context, as JSON strings (control characters visible).
std::string describe_diff(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  auto excerpt = [&](const std::string& s) {
    return Json(s.substr(from, 120)).dump(-1, ' ', false, Json::error_handler_t::replace);
  };
  std::ostringstream os;
  os << "first difference at byte " << i << " (lengths " << got.size() << " vs " << want.size() << ")\n"
     << "    got:    " << excerpt(got) << "\n    jinja2: " << excerpt(want);
  return os.str();
}

struct Outcome {
  bool raised = false;
  std::string text;  // the output, or the error message
};

template <typename Fn>
Outcome run(Fn&& fn) {
  try {
    return {false, fn()};
  } catch (const Error& e) {
    return {true, e.what()};
  }
}

// Compares one render with the oracle's; returns false (and reports) on a mismatch.
bool matches(const std::string& what, const Outcome& got, const Json& want) {
  if (want.contains("error")) {
    // raise_exception(msg) is jinja2's TemplateError(msg): the message reaches the caller unchanged.
    const std::string error = want["error"].get<std::string>();
    const std::string kRaised = "TemplateError: ";
    if (got.raised && error.rfind(kRaised, 0) == 0 && got.text != error.substr(kRaised.size())) {
      ADD_FAILURE() << what << ": raise_exception's message differs: got \"" << got.text << "\", jinja2 \""
                    << error.substr(kRaised.size()) << "\"";
      return false;
    }
    if (got.raised) return true;
    ADD_FAILURE() << what << ": jinja2 raised (" << want["error"].get<std::string>() << ") but dsi::jinja rendered "
                  << Json(got.text.substr(0, 200)).dump(-1, ' ', false, Json::error_handler_t::replace);
    return false;
  }
  const std::string expected = want["output"].get<std::string>();
  if (got.raised) {
    ADD_FAILURE() << what << ": dsi::jinja raised: " << got.text;
    return false;
  }
  if (got.text == expected) return true;
  ADD_FAILURE() << what << ": output differs from jinja2's; " << describe_diff(got.text, expected);
  return false;
}

TEST(JinjaParity, ChatTemplatesMatchJinja2) {
  if (!have_oracle()) return;
  const std::string src = source_dir();
  const Json manifest = read_json(src + "/tests/jinja/templates/templates.json");
  const Json convs = read_json(src + "/tests/jinja/conversations.json");
  ASSERT_FALSE(manifest.is_null());
  ASSERT_FALSE(convs.is_null());

  std::map<std::tuple<std::string, std::string, int>, const Json*> expected;
  for (const Json& r : oracle()["chat"]) {
    expected[{r["template"].get<std::string>(), r["conversation"].get<std::string>(), r["variant"].get<int>()}] = &r;
  }
  int compared = 0, equal = 0, both_raised = 0;
  for (const Json& t : manifest["templates"]) {
    const std::string name = t["name"].get<std::string>();
    std::unique_ptr<ChatTemplate> tmpl;
    if (t.contains("model_dir")) {
      tmpl = std::make_unique<ChatTemplate>(ChatTemplate::load(src + "/" + t["model_dir"].get<std::string>(), fixed_clock()));
    } else {
      std::ifstream f(src + "/" + t["file"].get<std::string>(), std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      std::map<std::string, std::string> special;
      const Json tokens = t.value("special_tokens", Json::object());
      for (const auto& [k, v] : tokens.items()) special[k] = v.get<std::string>();
      tmpl = std::make_unique<ChatTemplate>(ss.str(), special, name, fixed_clock());
    }
    for (const Json& conv : convs["conversations"]) {
      const std::string cname = conv["name"].get<std::string>();
      for (int vi = 0; vi < int(convs["variants"].size()); ++vi) {
        const Json& variant = convs["variants"][size_t(vi)];
        auto it = expected.find({name, cname, vi});
        ASSERT_NE(it, expected.end()) << "the oracle has no render of " << name << " x " << cname << " x " << vi;
        const Outcome got = run([&] {
          return tmpl->render(conv["messages"], conv.value("tools", Json()), variant["add_generation_prompt"].get<bool>(),
                              variant["kwargs"]);
        });
        ++compared;
        if (matches(name + " x " + cname + " x variant " + std::to_string(vi), got, *it->second)) {
          ++equal;
          both_raised += got.raised;
        }
      }
    }
  }
  EXPECT_EQ(size_t(compared), oracle()["chat"].size()) << "the oracle rendered pairs this test did not";
  EXPECT_EQ(equal, compared);
  std::cout << "[ jinja2 " << oracle()["jinja2_version"].get<std::string>() << " ] " << equal << " of " << compared
            << " (template, conversation, variant) renders identical (" << both_raised << " raised in both)\n";
}

TEST(JinjaParity, EngineCasesMatchJinja2) {
  if (!have_oracle()) return;
  const Json cases = read_json(source_dir() + "/tests/jinja/engine_cases.json");
  ASSERT_FALSE(cases.is_null());
  ASSERT_EQ(cases["cases"].size(), oracle()["engine"].size()) << "engine_cases.json changed since the oracle ran";
  int equal = 0;
  for (size_t i = 0; i < cases["cases"].size(); ++i) {
    const Json& c = cases["cases"][i];
    const Json& want = oracle()["engine"][i];
    ASSERT_EQ(c["name"], want["name"]);
    const Outcome got = run([&] {
      jinja::Template t(c["template"].get<std::string>(), c["name"].get<std::string>(), fixed_clock());
      return t.render(c.value("vars", Json::object()));
    });
    equal += matches("engine case " + c["name"].get<std::string>(), got, want);
  }
  std::cout << "[ jinja2 " << oracle()["jinja2_version"].get<std::string>() << " ] " << equal << " of "
            << cases["cases"].size() << " engine cases identical\n";
}

}  // namespace
}  // namespace dsi::test
