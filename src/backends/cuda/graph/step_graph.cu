// Step graphs; see step_graph.h.
#include "backends/cuda/graph/step_graph.h"

#include <string>
#include <vector>

#include "backends/cuda/common.cuh"
#include "backends/cuda/memory/memory.h"

namespace dsi::cuda {

namespace {
constexpr int kMaxChecks = 4096;  // deferred input checks per graph (a 78-layer step has ~1000)

// Makes `state` this thread's warm-up or capture for the scope (memory/memory.h: CaptureState).
class ScopedCaptureState {
 public:
  explicit ScopedCaptureState(CaptureState* state) {
    DSI_CHECK(capture_state() == nullptr, "a step graph is being captured on this thread already");
    capture_state() = state;
  }
  ~ScopedCaptureState() { capture_state() = nullptr; }
  ScopedCaptureState(const ScopedCaptureState&) = delete;
  ScopedCaptureState& operator=(const ScopedCaptureState&) = delete;
};
}  // namespace

struct StepGraph::Impl {
  Device device;
  std::shared_ptr<BlockPool> pool;
  Tensor flags;  // [kMaxChecks] u64 on the device (the shared pool: outlives captures)
  DeferredChecks checks;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<unsigned long long> host_flags;

  ~Impl() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

std::shared_ptr<BlockPool> StepGraph::new_pool(Device device) {
  DSI_CHECK(device.type == DeviceType::CUDA, "a step graph runs on a CUDA device, not {}",
            device.str());
  return make_private_pool(device.index);
}

StepGraph::StepGraph(Device device, std::shared_ptr<BlockPool> pool)
    : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->pool = pool != nullptr ? std::move(pool) : new_pool(device);
}

StepGraph::~StepGraph() {
  if (impl_->exec == nullptr) return;
  // The graph's blocks return to its private pool; let replays in flight finish first.
  try {
    DeviceGuard guard(impl_->device);
    cudaStreamSynchronize(stream());
  } catch (const std::exception&) {  // no throw from a destructor
  }
}

bool StepGraph::captured() const { return impl_->exec != nullptr; }

int StepGraph::deferred_checks() const { return int(impl_->checks.what.size()); }

void StepGraph::warm_up(const std::function<void()>& fn) {
  Impl& g = *impl_;
  DSI_CHECK(g.exec == nullptr, "this step graph is captured already");
  DeviceGuard guard(g.device);
  CaptureState state{g.device.index, g.pool, nullptr};
  ScopedCaptureState scope(&state);
  fn();
}

void StepGraph::capture(const std::function<void()>& fn) {
  Impl& g = *impl_;
  DSI_CHECK(g.exec == nullptr, "this step graph is captured already");
  DSI_CHECK(capture_state() == nullptr, "a step graph is being captured on this thread already");
  DeviceGuard guard(g.device);
  if (!g.flags.defined())
    g.flags = Tensor::empty({kMaxChecks}, DType::I64, g.device);
  g.checks = DeferredChecks{static_cast<unsigned long long*>(g.flags.raw()), kMaxChecks, {}};
  CaptureState state{g.device.index, g.pool, &g.checks};
  const cudaStream_t s = stream();
  sync_stream();  // the eager work before it is done: capture sees an idle stream
  DSI_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    ScopedCaptureState scope(&state);  // ends before the handler or the end of the capture
    DSI_CUDA_CHECK(cudaMemsetAsync(g.flags.raw(), 0xff, g.flags.nbytes(), s));
    fn();
  } catch (...) {
    if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    g.checks.what.clear();
    throw;
  }
  const cudaError_t e = cudaStreamEndCapture(s, &graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    g.checks.what.clear();
    fail("capturing a step graph on {} failed: {} (an op synchronised or copied from host memory "
         "inside the step)",
         g.device.str(), cudaGetErrorString(e));
  }
  g.graph = graph;
  DSI_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
  g.host_flags.resize(g.checks.what.size());
}

int StepGraph::kernel_nodes() const {
  const Impl& g = *impl_;
  if (g.graph == nullptr) return 0;
  size_t n = 0;
  DSI_CUDA_CHECK(cudaGraphGetNodes(g.graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) DSI_CUDA_CHECK(cudaGraphGetNodes(g.graph, nodes.data(), &n));
  int kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    DSI_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    kernels += type == cudaGraphNodeTypeKernel ? 1 : 0;
  }
  return kernels;
}

void StepGraph::replay() {
  Impl& g = *impl_;
  DSI_CHECK(g.exec != nullptr, "replay of a step graph that was not captured");
  DeviceGuard guard(g.device);
  DSI_CUDA_CHECK(cudaGraphLaunch(g.exec, stream()));
  const size_t n = g.checks.what.size();
  if (n > 0)
    copy_to_host(g.host_flags.data(), g.flags.raw(), n * sizeof(unsigned long long));
  else
    sync_stream();
  for (size_t i = 0; i < n; ++i)
    if (g.host_flags[i] != ErrorFlag::kNone)
      fail("{} (item {}) in a replayed step on {}", g.checks.what[i], g.host_flags[i],
           g.device.str());
}

}  // namespace dsi::cuda
