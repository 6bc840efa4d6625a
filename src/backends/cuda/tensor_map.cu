// Tensor maps for the copy engine; see tensor_map.h.
#include <cudaTypedefs.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/tensor_map.h"

namespace dsi::cuda {

CUtensorMap byte_tensor_map(const void* base, int rank, const uint64_t* dims, const uint64_t* strides,
                            const uint32_t* box, CUtensorMapSwizzle swizzle, const char* what) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    DSI_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    DSI_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr, "the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  DSI_CHECK(rank >= 1 && rank <= 5, "{}: a tensor map of {} dimensions", what, rank);
  cuuint64_t d[5], s[4];
  cuuint32_t b[5], elem_strides[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    elem_strides[i] = 1;
    if (i + 1 < rank) s[i] = strides[i];
  }
  CUtensorMap map{};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, cuuint32_t(rank), const_cast<void*>(base), d, s, b,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DSI_CHECK(r == CUDA_SUCCESS, "{}: cannot describe the tensor to the copy engine (error {})", what, int(r));
  return map;
}

}  // namespace dsi::cuda
