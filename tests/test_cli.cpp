// The dsinfer CLI contract: `generate --json` prints one JSON object as its last stdout line,
// `logits` writes .npy files of the documented shapes, and bad input gives a one-line error on
// stderr with a non-zero exit code.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/npy.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi {
namespace {

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

CliResult run_cli(const std::string& args) {
  test::TempDir tmp;
  const std::string out = tmp.path() + "/out", err = tmp.path() + "/err";
  const std::string cmd = std::string(DSI_CLI_PATH) + " " + args + " >" + out + " 2>" + err +
                          " </dev/null";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

std::string ids_csv(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

nlohmann::json golden_prompt(const std::string& fixture, size_t index) {
  return test::load_manifest(fixture).at("prompts").at(index);
}

TEST(Cli, GenerateJsonLastLine) {
  const auto p = golden_prompt("glm_tiny", 4);
  const auto ids = p.at("ids").get<std::vector<int32_t>>();
  const auto greedy = p.at("greedy").get<std::vector<int32_t>>();
  const CliResult r = run_cli("generate --model " + test::fixture_dir("glm_tiny") + " --prompt-ids " +
                              ids_csv(ids) + " --max-new-tokens " + std::to_string(greedy.size()) +
                              " --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string last = r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1);
  const auto j = nlohmann::json::parse(last);
  EXPECT_EQ(j.at("prompt_ids").get<std::vector<int32_t>>(), ids);
  EXPECT_EQ(j.at("output_ids").get<std::vector<int32_t>>(), greedy);
  const auto& st = j.at("stats");
  EXPECT_EQ(st.at("prompt_tokens").get<int>(), int(ids.size()));
  EXPECT_EQ(st.at("generated_tokens").get<int>(), int(greedy.size()));
  EXPECT_GT(st.at("prefill_seconds").get<double>(), 0.0);
  EXPECT_GT(st.at("decode_tokens_per_second").get<double>(), 0.0);
}

TEST(Cli, LogitsWritesNpyOfDocumentedShapes) {
  const auto p = golden_prompt("dsv32_tiny", 3);
  const auto ids = p.at("ids").get<std::vector<int32_t>>();
  test::TempDir tmp;
  const std::string out = tmp.path() + "/l.npy", mtp = tmp.path() + "/m.npy";
  const CliResult r = run_cli("logits --model " + test::fixture_dir("dsv32_tiny") + " --prompt-ids " +
                              ids_csv(ids) + " --out " + out + " --mtp-out " + mtp +
                              " --prefill-chunk 5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Tensor l = read_npy(out), m = read_npy(mtp);
  const int64_t n = int64_t(ids.size());
  EXPECT_EQ(l.shape(), (Shape{n, 448}));
  EXPECT_EQ(m.shape(), (Shape{n - 1, 448}));
  const std::string g = test::fixture_dir("dsv32_tiny") + "/goldens/";
  EXPECT_LE(test::nmse(l, read_npy(g + p.at("logits").get<std::string>())), tol::kGoldenLogitsNmse);
  EXPECT_LE(test::nmse(m, read_npy(g + p.at("mtp_logits").get<std::string>())), tol::kGoldenLogitsNmse);
}

// Bad input: the last stderr line is the one error line, non-zero exit, nothing on stdout.
TEST(Cli, BadInputGivesOneLineError) {
  const std::string model = "--model " + test::fixture_dir("glm_tiny");
  struct Case {
    std::string args, needle;
  };
  const std::vector<Case> cases = {
      {"generate " + model + " --prompt-ids ''", "empty"},
      {"generate " + model + " --prompt-ids 1,,2", "is not a token id"},
      {"generate " + model + " --prompt-ids 1,x", "'x' is not a token id"},
      {"generate " + model + " --prompt-ids 1,512", "512"},
      {"generate " + model + " --prompt-ids -3", "-3"},
      {"generate " + model + " --prompt hello", "tokenizer"},
      {"generate " + model, "--prompt-ids or --prompt"},
      {"generate --model /nonexistent/dir --prompt-ids 1", "/nonexistent/dir"},
      {"generate " + model + " --prompt-ids 1 --device cuda", "--device cuda"},
      {"logits " + model + " --prompt-ids 1,2 --out /nonexistent/dir/x.npy", "/nonexistent/dir/x.npy"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const CliResult r = run_cli(c.args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_LT(r.exit_code, 128) << "crashed: " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    const size_t at = r.err.find("error: ");
    ASSERT_NE(at, std::string::npos) << r.err;
    EXPECT_TRUE(at == 0 || r.err[at - 1] == '\n') << r.err;
    EXPECT_EQ(r.err.find('\n', at), r.err.size() - 1) << "error is not one last line: " << r.err;
    EXPECT_EQ(r.out, "");
  }
}

// Thread ranks from the command line give the single-rank greedy tokens.
TEST(Cli, ThreadRanksGenerateTheSameTokens) {
  const auto p = golden_prompt("dsv32_tiny", 4);
  const auto greedy = p.at("greedy").get<std::vector<int32_t>>();
  const CliResult r = run_cli("generate --model " + test::fixture_dir("dsv32_tiny") + " --prompt-ids " +
                              ids_csv(p.at("ids").get<std::vector<int32_t>>()) +
                              " --max-new-tokens " + std::to_string(greedy.size()) +
                              " --ignore-eos --json --tp 4 --dcp 2 --dcp-interleave 2 --dcp-comm a2a"
                              " --check-lockstep --prefill-chunk 5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string last = r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1);
  EXPECT_EQ(nlohmann::json::parse(last).at("output_ids").get<std::vector<int32_t>>(), greedy);
}

#ifdef DSI_WITH_MPI
// Four processes under mpirun (one rank each) give the single-rank greedy tokens; only rank 0
// prints them.
TEST(Cli, MpirunFourProcesses) {
  const auto p = golden_prompt("glm_tiny", 5);
  const auto greedy = p.at("greedy").get<std::vector<int32_t>>();
  // OpenMPI refuses root without these; its internals are not ours to leak-check.
  const std::string env =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 ";
  const std::string cmd = env + "mpirun -np 4 --oversubscribe " + std::string(DSI_CLI_PATH) +
                          " generate --model " + test::fixture_dir("glm_tiny") + " --prompt-ids " +
                          ids_csv(p.at("ids").get<std::vector<int32_t>>()) + " --max-new-tokens " +
                          std::to_string(greedy.size()) +
                          " --ignore-eos --json --tp 4 --dcp 4 --check-lockstep";
  test::TempDir tmp;
  const int status = std::system((cmd + " >" + tmp.path() + "/out 2>" + tmp.path() + "/err").c_str());
  const std::string out = slurp(tmp.path() + "/out");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(tmp.path() + "/err");
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "only rank 0 prints: " << out;
  EXPECT_EQ(nlohmann::json::parse(out).at("output_ids").get<std::vector<int32_t>>(), greedy);
}
#endif

TEST(Cli, UsageErrorsExitNonZero) {
  for (const std::string args : {"", "generate", "frobnicate", "generate --model x --top-p 2 --prompt-ids 1",
                                 "logits --model x --prompt-ids 1"}) {
    SCOPED_TRACE(args);
    const CliResult r = run_cli(args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_LT(r.exit_code, 128) << r.err;
    EXPECT_FALSE(r.err.empty());
  }
}

}  // namespace
}  // namespace dsi
