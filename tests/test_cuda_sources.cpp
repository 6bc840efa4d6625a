// The launch contract of the CUDA backend, checked on its sources (so it runs without a GPU, in
// CI): every kernel is launched as a programmatic dependent launch (common.cuh's launch()), so
// every kernel must call pdl_wait() / pdl_enter() before it can return (or say
// pdl_leave_unwaited() where the contract allows a block to leave first), and no kernel is launched
// with <<<...>>> (which would quietly drop the overlap). A kernel that forgot the wait would read
// its inputs while the kernel before it still writes them: a race no op test is sure to catch.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace dsi {
namespace {

namespace fs = std::filesystem;

struct Kernel {
  std::string name;
  std::string body;  // between the braces
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Drops // comments (the sources use no block comments inside kernels) so that prose mentioning
// a call does not count as one.
std::string strip_line_comments(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '/' && i + 1 < s.size() && s[i + 1] == '/') {
      while (i < s.size() && s[i] != '\n') ++i;
      if (i < s.size()) out += '\n';
      continue;
    }
    out += s[i];
  }
  return out;
}

// Index just past the parenthesis that closes the one at `open`.
size_t close_paren(const std::string& s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    if (s[i] == ')' && --depth == 0) return i + 1;
  }
  return std::string::npos;
}

// s without the bodies of its lambdas ("[captures](params) ... { body }" -> "[captures](params) ... {}"):
// a return inside a lambda leaves the lambda, not the kernel.
std::string strip_lambda_bodies(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t lb = s.find('[', i);
    if (lb == std::string::npos) break;
    const size_t rb = s.find(']', lb);
    size_t p = rb == std::string::npos ? rb : s.find_first_not_of(" \n", rb + 1);
    const bool captures = rb != std::string::npos && s.find_first_not_of("&=_, abcdefghijklmnopqrstuvwxyz"
                                                                          "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
                                                                          lb + 1) == rb;
    if (!captures || p == std::string::npos || s[p] != '(') {
      out.append(s, i, lb + 1 - i);
      i = lb + 1;
      continue;
    }
    const size_t params_end = close_paren(s, p);
    const size_t brace = params_end == std::string::npos ? params_end : s.find_first_of("{;", params_end);
    if (brace == std::string::npos || s[brace] == ';') {  // a call through an array element, not a lambda
      out.append(s, i, lb + 1 - i);
      i = lb + 1;
      continue;
    }
    int depth = 0;
    size_t end = brace;
    for (; end < s.size(); ++end) {
      if (s[end] == '{') ++depth;
      if (s[end] == '}' && --depth == 0) break;
    }
    out.append(s, i, brace + 1 - i);
    out += '}';
    i = end + 1;
  }
  if (i < s.size()) out.append(s, i, std::string::npos);
  return out;
}

// Every __global__ function definition of a source: its name and body.
std::vector<Kernel> kernels_of(const std::string& src) {
  std::vector<Kernel> out;
  for (size_t at = src.find("__global__"); at != std::string::npos; at = src.find("__global__", at + 1)) {
    size_t open = src.find('(', at);
    const std::string before = src.substr(at, open - at);
    if (before.find("__launch_bounds__") != std::string::npos) open = src.find('(', close_paren(src, open));
    const size_t name_end = src.find_last_not_of(" \n", open - 1) + 1;
    const size_t name_begin = src.find_last_of(" \n", name_end - 1) + 1;
    const size_t params_end = close_paren(src, open);
    const size_t brace = src.find_first_of("{;", params_end);
    if (brace == std::string::npos || src[brace] == ';') continue;  // a declaration
    int depth = 0;
    size_t end = brace;
    for (; end < src.size(); ++end) {
      if (src[end] == '{') ++depth;
      if (src[end] == '}' && --depth == 0) break;
    }
    out.push_back({src.substr(name_begin, name_end - name_begin), src.substr(brace + 1, end - brace - 1)});
  }
  return out;
}

std::vector<fs::path> cuda_sources() {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(test::source_dir()) / "src/backends/cuda"))
    if (e.is_regular_file() && e.path().extension() == ".cu") files.push_back(e.path());
  return files;
}

TEST(CudaSources, EveryKernelWaitsForTheKernelBefore) {
  const std::vector<fs::path> files = cuda_sources();
  ASSERT_GT(files.size(), 10u) << "the CUDA backend's sources were not found";
  int kernels = 0;
  for (const fs::path& f : files) {
    const std::string src = strip_line_comments(read_text(f));
    for (const Kernel& k : kernels_of(src)) {
      ++kernels;
      const std::string body = strip_lambda_bodies(k.body);
      size_t wait = std::string::npos;
      for (const char* call : {"pdl_enter()", "pdl_wait()"}) wait = std::min(wait, body.find(call));
      ASSERT_NE(wait, std::string::npos) << f.filename() << ": kernel " << k.name << " never waits";
      // A return before the first wait (in the text) could leave before waiting on some path.
      const size_t ret = body.find("return");
      if (ret < wait) {
        // A path that leaves early must wait just before (the GEMV's ungrouped path, the indexer
        // logits' invalid rows), or say that it leaves unwaited (the indexer logits' rows that
        // lead no group, whose leader waits: common.cuh's contract); anything else fails.
        const std::string head = body.substr(0, ret);
        EXPECT_TRUE(head.rfind("pdl_enter()") != std::string::npos ||
                    head.rfind("pdl_leave_unwaited()") != std::string::npos)
            << f.filename() << ": kernel " << k.name << " can return before it waits";
      }
    }
    EXPECT_EQ(src.find("<<<"), std::string::npos)
        << f.filename() << " launches a kernel with <<<>>>: use launch() (common.cuh)";
  }
  EXPECT_GT(kernels, 30) << "fewer kernels than the backend has: the parser lost some";
}

// Calls that synchronise the whole GPU implicitly (cudaMalloc, cudaFree, pinned host allocations,
// the synchronous copies and sets): made while another rank's collective kernel already waits for
// this rank's, they never return (docs/parallelism.md, ranks sharing GPUs). They stay where they
// run at safe points: the caching allocator (memory.cu; stream-ordered with GPU sharing) and a
// peer group's creation and end (peer_collectives.cu, a rendezvous of its members). A new use
// elsewhere fails here until it is shown safe and listed.
TEST(CudaSources, GpuWideSynchronisingCallsStayInTheirPlaces) {
  const char* calls[] = {"cudaMalloc(",     "cudaFree(",       "cudaHostAlloc(", "cudaMallocHost(",
                         "cudaFreeHost(",   "cudaMemcpy(",     "cudaMemset(",    "cudaDeviceSynchronize(",
                         "cudaHostRegister(", "cudaMallocManaged("};
  const std::set<std::string> allowed = {"memory.cu", "peer_collectives.cu"};
  int files = 0, seen_in_allowed = 0;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(test::source_dir()) / "src")) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || (ext != ".cu" && ext != ".cuh" && ext != ".cpp" && ext != ".h")) continue;
    ++files;
    const std::string src = strip_line_comments(read_text(e.path()));
    const std::string name = e.path().filename().string();
    for (const char* call : calls) {
      if (src.find(call) == std::string::npos) continue;
      if (allowed.count(name) != 0) ++seen_in_allowed;
      else ADD_FAILURE() << e.path() << " calls " << call << ": a GPU-wide synchronisation";
    }
  }
  EXPECT_GT(files, 100) << "the sources were not found";
  EXPECT_GE(seen_in_allowed, 4) << "the scan no longer sees the allocator's own calls";
}

// The parser itself, on a small source: it finds both kernels, their names and bodies, and skips
// a declaration.
TEST(CudaSources, ParserFindsKernelsAndBodies) {
  const std::string src =
      "__global__ void a_kernel(int x);\n"
      "template <int V>\n__global__ void __launch_bounds__(256, 2) b_kernel(P p) {\n  pdl_enter();\n"
      "  if (p.x) { return; }\n}\n"
      "__global__ void c_kernel(const P p, int k) { return; }\n";
  const std::vector<Kernel> k = kernels_of(src);
  ASSERT_EQ(k.size(), 2u);
  EXPECT_EQ(k[0].name, "b_kernel");
  EXPECT_NE(k[0].body.find("pdl_enter()"), std::string::npos);
  EXPECT_NE(k[0].body.find("return;"), std::string::npos);
  EXPECT_EQ(k[1].name, "c_kernel");
  EXPECT_EQ(k[1].body, " return; ");
  EXPECT_EQ(strip_line_comments("a // pdl_wait()\nb"), "a \nb");
  // Lambda bodies go (their returns are not the kernel's); indexing and calls through arrays stay.
  EXPECT_EQ(strip_lambda_bodies("auto f = [&](int i) { return g(i); }; x = a[i](3); return;"),
            "auto f = [&](int i) {}; x = a[i](3); return;");
  EXPECT_EQ(strip_lambda_bodies("auto h = [=, &y](int64_t t) -> int { if (t) { return 1; } return 0; }; y[2] = 1;"),
            "auto h = [=, &y](int64_t t) -> int {}; y[2] = 1;");
  EXPECT_EQ(strip_lambda_bodies("v[k] = w[k + 1];"), "v[k] = w[k + 1];");
}

}  // namespace
}  // namespace dsi
