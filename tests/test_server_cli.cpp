// `dsinfer chat` with piped stdin (one reply line per input line, through the serving engine and
// the bundled model's chat template) and `dsinfer serve` / `chat` refusing bad options with one
// error line.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "test_util.h"

namespace dsi {
namespace {

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs the CLI with `input` on stdin.
CliRun run_cli(const std::string& args, const std::string& input) {
  test::TempDir tmp;
  const std::string in = tmp.path() + "/in", out = tmp.path() + "/out", err = tmp.path() + "/err";
  std::ofstream(in) << input;
  const std::string cmd = std::string(DSI_CLI_PATH) + " " + args + " <" + in + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_all(out);
  r.err = read_all(err);
  return r;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream is(s);
  for (std::string line; std::getline(is, line);) lines.push_back(line);
  return lines;
}

TEST(ServerCli, ChatWithPipedStdin) {
  const std::string args = "chat --max-tokens 12 --max-model-len 512 --kv-cache-memory 32M";
  const CliRun a = run_cli(args, "Who made the light?\n\nAnd what did he call it?\n");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const auto lines = lines_of(a.out);
  ASSERT_EQ(lines.size(), 2u) << a.out;  // one reply per non-empty input line
  EXPECT_FALSE(lines[0].empty());
  EXPECT_FALSE(lines[1].empty());
  // Greedy: the first reply does not depend on what follows; the second sees the conversation.
  const CliRun first = run_cli(args, "Who made the light?\n");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(lines_of(first.out), std::vector<std::string>{lines[0]});
  const CliRun alone = run_cli(args, "And what did he call it?\n");
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  EXPECT_EQ(lines_of(alone.out).size(), 1u);
  // A stop string cuts the reply.
  const std::string stop = lines[0].substr(lines[0].size() / 2, 2);
  if (stop.find_first_of(" '\"\\$`") == std::string::npos) {
    const CliRun s = run_cli(args + " --stop '" + stop + "'", "Who made the light?\n");
    ASSERT_EQ(s.exit_code, 0) << s.err;
    EXPECT_EQ(lines_of(s.out), std::vector<std::string>{lines[0].substr(0, lines[0].find(stop))});
  }
}

TEST(ServerCli, BadOptionsGiveOneLineErrors) {
  CliRun r = run_cli("serve --model /nonexistent/model --port 0", "");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/model"), std::string::npos) << r.err;
  r = run_cli("serve --kv-cache-memory 12Q --port 0", "");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--kv-cache-memory"), std::string::npos) << r.err;
  r = run_cli("serve --port 70000", "");
  EXPECT_NE(r.exit_code, 0);
  r = run_cli("chat --chat-template-kwargs '[1]'", "hi\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("must be a JSON object"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dsi
