// XLA FFI handlers for the MX quantize / dequantize kernels (jax_mxfp8/kernels/sm90/quantize.py).
//
//   jax_mxfp8_quantize_rowcol  x -> (row_data, row_scale, col_data, col_scale)   attrs: scale_rounding,
//                              tune (0 = production; > 0 = registry.TUNING_VARIANTS, for benchmarks)
//   jax_mxfp8_quantize         x -> (data, scale)     attrs: mode (1 row, 2 col, 3 square), scale_rounding
//   jax_mxfp8_dequantize       (data, scale) -> out   attrs: block (1 row, 2 col, 3 square)
//
// Arrays of rank >= 2 are viewed as 2-D with the leading axes flattened into rows (exact for all block
// kinds because both dimensions are multiples of 32). FP8 buffers come in as AnyBuffer (the jaxlib 0.10
// FFI headers have no typed F8 buffers) and are checked at run time. The element format is taken from
// the FP8 output (quantize) or input (dequantize) dtype. Every failure is returned as an ffi::Error.
// Handlers only enqueue work on XLA's stream (no allocation, no synchronisation): they are marked
// command-buffer (CUDA graph) compatible.
#include <string>

#include "common.h"

namespace jmx {
namespace {

ffi::Error CheckBlockable(const Tensor2D& t, const char* what) {
  if (t.rows % 32 != 0 || t.cols % 32 != 0) {
    return ffi::Error::InvalidArgument(std::string("jax_mxfp8: ") + what + " is " + std::to_string(t.rows) + " x " +
                                       std::to_string(t.cols) +
                                       " (leading axes flattened); the kernels need both multiples of 32");
  }
  return ffi::Error::Success();
}

// Scale shape of a (rows, cols) array for a block kind.
void ScaleShape(int mode, int64_t rows, int64_t cols, int64_t* srows, int64_t* scols) {
  *srows = (mode == kCol || mode == kSquare) ? rows / 32 : rows;
  *scols = (mode == kRow || mode == kSquare) ? cols / 32 : cols;
}

ffi::Error QuantizeRowColImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                              ffi::Result<ffi::AnyBuffer> row_data, ffi::Result<ffi::AnyBuffer> row_scale,
                              ffi::Result<ffi::AnyBuffer> col_data, ffi::Result<ffi::AnyBuffer> col_scale,
                              int32_t scale_rounding, int32_t tune) {
  Tensor2D t[5];
  int in_code = 0, elem = 0, elem_col = 0;
  JMX_RETURN_IF_ERROR(InCode(x.element_type(), "x", &in_code));
  JMX_RETURN_IF_ERROR(As2D(x, "x", &t[0]));
  JMX_RETURN_IF_ERROR(CheckBlockable(t[0], "x"));
  JMX_RETURN_IF_ERROR(ElemCode(row_data->element_type(), "row data", &elem));
  JMX_RETURN_IF_ERROR(ElemCode(col_data->element_type(), "column data", &elem_col));
  if (elem != elem_col) return ffi::Error::InvalidArgument("jax_mxfp8: row and column data dtypes differ");
  const int64_t m = t[0].rows, k = t[0].cols;
  JMX_RETURN_IF_ERROR(As2D(row_data, "row data", &t[1]));
  JMX_RETURN_IF_ERROR(Expect(t[1], row_data->element_type(), row_data->element_type(), m, k, "row data"));
  JMX_RETURN_IF_ERROR(As2D(row_scale, "row scale", &t[2]));
  JMX_RETURN_IF_ERROR(Expect(t[2], row_scale->element_type(), ffi::DataType::U8, m, k / 32, "row scale"));
  JMX_RETURN_IF_ERROR(As2D(col_data, "column data", &t[3]));
  JMX_RETURN_IF_ERROR(Expect(t[3], col_data->element_type(), col_data->element_type(), m, k, "column data"));
  JMX_RETURN_IF_ERROR(As2D(col_scale, "column scale", &t[4]));
  JMX_RETURN_IF_ERROR(Expect(t[4], col_scale->element_type(), ffi::DataType::U8, m / 32, k, "column scale"));
  if (m == 0 || k == 0) return ffi::Error::Success();
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOpQuantize, in_code, kRowCol, elem, scale_rounding, tune, &entry));
  return Launch(entry, device, t, 5, stream);
}

ffi::Error QuantizeImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                        ffi::Result<ffi::AnyBuffer> scale, int32_t mode, int32_t scale_rounding) {
  if (mode != kRow && mode != kCol && mode != kSquare) {
    return ffi::Error::InvalidArgument("jax_mxfp8: quantize mode must be 1 (row), 2 (col) or 3 (square), got " +
                                       std::to_string(mode));
  }
  Tensor2D t[3];
  int in_code = 0, elem = 0;
  JMX_RETURN_IF_ERROR(InCode(x.element_type(), "x", &in_code));
  JMX_RETURN_IF_ERROR(As2D(x, "x", &t[0]));
  JMX_RETURN_IF_ERROR(CheckBlockable(t[0], "x"));
  JMX_RETURN_IF_ERROR(ElemCode(data->element_type(), "data", &elem));
  const int64_t m = t[0].rows, k = t[0].cols;
  int64_t sm = 0, sk = 0;
  ScaleShape(mode, m, k, &sm, &sk);
  JMX_RETURN_IF_ERROR(As2D(data, "data", &t[1]));
  JMX_RETURN_IF_ERROR(Expect(t[1], data->element_type(), data->element_type(), m, k, "data"));
  JMX_RETURN_IF_ERROR(As2D(scale, "scale", &t[2]));
  JMX_RETURN_IF_ERROR(Expect(t[2], scale->element_type(), ffi::DataType::U8, sm, sk, "scale"));
  if (m == 0 || k == 0) return ffi::Error::Success();
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOpQuantize, in_code, mode, elem, scale_rounding, 0, &entry));
  return Launch(entry, device, t, 3, stream);
}

ffi::Error DequantizeImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer data, ffi::AnyBuffer scale,
                          ffi::Result<ffi::AnyBuffer> out, int32_t block) {
  if (block != kRow && block != kCol && block != kSquare) {
    return ffi::Error::InvalidArgument("jax_mxfp8: dequantize block must be 1 (row), 2 (col) or 3 (square), got " +
                                       std::to_string(block));
  }
  Tensor2D t[3];
  int elem = 0, out_code = 0;
  JMX_RETURN_IF_ERROR(ElemCode(data.element_type(), "data", &elem));
  JMX_RETURN_IF_ERROR(InCode(out->element_type(), "output", &out_code));
  JMX_RETURN_IF_ERROR(As2D(data, "data", &t[0]));
  JMX_RETURN_IF_ERROR(CheckBlockable(t[0], "data"));
  const int64_t m = t[0].rows, k = t[0].cols;
  int64_t sm = 0, sk = 0;
  ScaleShape(block, m, k, &sm, &sk);
  JMX_RETURN_IF_ERROR(As2D(scale, "scale", &t[1]));
  JMX_RETURN_IF_ERROR(Expect(t[1], scale.element_type(), ffi::DataType::U8, sm, sk, "scale"));
  JMX_RETURN_IF_ERROR(As2D(out, "output", &t[2]));
  JMX_RETURN_IF_ERROR(Expect(t[2], out->element_type(), out->element_type(), m, k, "output"));
  if (m == 0 || k == 0) return ffi::Error::Success();
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOpDequantize, elem, block, out_code, 0, 0, &entry));
  return Launch(entry, device, t, 3, stream);
}

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

// Everything below is the library's public C ABI: compiled with default visibility (the rest of the
// library is -fvisibility=hidden) and listed by csrc/exports.map.
#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_quantize_rowcol, jmx::QuantizeRowColImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("scale_rounding")
                                  .Attr<int32_t>("tune"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_quantize, jmx::QuantizeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("mode")
                                  .Attr<int32_t>("scale_rounding"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_dequantize, jmx::DequantizeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("block"),
                              {ffi::Traits::kCmdBufferCompatible});

// Introspection for tests and the Python loader (plain C ABI, no Python).
extern "C" int jax_mxfp8_kernel_count() { return jmx::kKernelTableSize; }
extern "C" const char* jax_mxfp8_kernel_name(int i) {
  return (i >= 0 && i < jmx::kKernelTableSize) ? jmx::kKernelTable[i].name : nullptr;
}
extern "C" int jax_mxfp8_kernel_arch(int i) {
  return (i >= 0 && i < jmx::kKernelTableSize) ? jmx::kKernelTable[i].arch_major : -1;
}
// Loads every variant built for `device`'s architecture (call before CUDA-graph capture). Returns a
// cudaError_t code (0 on success); a device of another architecture loads nothing and returns 0.
extern "C" int jax_mxfp8_preload(int device) {
  int major = 0;
  if (jmx::DeviceMajor(device, &major).failure()) return static_cast<int>(cudaErrorInvalidDevice);
  for (int i = 0; i < jmx::kKernelTableSize; ++i) {
    if (jmx::kKernelTable[i].arch_major != major) continue;
    cudaError_t err = jmx::kKernelTable[i].load(device);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  return 0;
}

#pragma GCC visibility pop
