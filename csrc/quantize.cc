// XLA FFI handlers for the MX quantize / dequantize kernels (jax_mxfp8/kernels/common/quantize.py).
//
//   jax_mxfp8_quantize_rowcol  x -> (row_data, row_scale, col_data, col_scale)   a "rowcol" quantize variant
//   jax_mxfp8_quantize         x -> (data, scale)                                a "row", "col" or "square" one
//   jax_mxfp8_dequantize       (data, scale) -> out                              a dequantize variant
//   attribute of all three: kernel (string) = the registry variant name (config.name), e.g.
//   "quantize_rowcol_bf16_e4m3_up", "quantize_row_f32_e5m2_floor_t1", "dequantize_col_e4m3_bf16".
//
// The variant decides everything the old integer attributes did (mode / block and so the scale shapes,
// scale rounding, tuning); the handlers check every buffer against its named parameters (in_dtype,
// mode, elem_dtype, block, out_dtype). Arrays of rank >= 2 are viewed as 2-D with the leading axes
// flattened into rows (exact for all block kinds because both dimensions are multiples of 32). FP8 buffers
// come in as AnyBuffer (the jaxlib 0.10 FFI headers have no typed F8 buffers) and are checked at run time.
// Every failure is returned as an ffi::Error. Handlers only enqueue work on XLA's stream (no allocation,
// no synchronisation): they are marked command-buffer (CUDA graph) compatible.
#include <string>
#include <string_view>

#include "common.h"

namespace jmx {
namespace {

ffi::Error CheckBlockable(const TensorView& t, const char* what) {
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

const char* ModeName(int64_t mode) {
  static const char* const kNames[] = {"rowcol", "row", "col", "square"};
  return (mode >= 0 && mode < 4) ? kNames[mode] : "(none)";
}

ffi::Error QuantizeRowColImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x,
                              ffi::Result<ffi::AnyBuffer> row_data, ffi::Result<ffi::AnyBuffer> row_scale,
                              ffi::Result<ffi::AnyBuffer> col_data, ffi::Result<ffi::AnyBuffer> col_scale,
                              std::string_view kernel) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, "quantize", kernel, &entry));
  const int64_t mode = Param(entry, "mode");
  if (mode != kRowCol) {
    return ffi::Error::InvalidArgument(std::string("jax_mxfp8: kernel '") + entry->name + "' has mode " +
                                       ModeName(mode) +
                                       "; jax_mxfp8_quantize_rowcol runs rowcol variants (use jax_mxfp8_quantize)");
  }
  TensorView t[5];
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "in_dtype", x.element_type(), "x"));
  JMX_RETURN_IF_ERROR(As2D(x, "x", &t[0]));
  JMX_RETURN_IF_ERROR(CheckBlockable(t[0], "x"));
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "elem_dtype", row_data->element_type(), "row data"));
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "elem_dtype", col_data->element_type(), "column data"));
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
  return Launch(entry, device, t, 5, stream);
}

ffi::Error QuantizeImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                        ffi::Result<ffi::AnyBuffer> scale, std::string_view kernel) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, "quantize", kernel, &entry));
  const int64_t mode = Param(entry, "mode");  // decides the scale shape
  if (mode != kRow && mode != kCol && mode != kSquare) {
    return ffi::Error::InvalidArgument(std::string("jax_mxfp8: kernel '") + entry->name + "' has mode " +
                                       ModeName(mode) +
                                       "; jax_mxfp8_quantize runs row, col or square variants (rowcol ones: "
                                       "jax_mxfp8_quantize_rowcol)");
  }
  TensorView t[3];
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "in_dtype", x.element_type(), "x"));
  JMX_RETURN_IF_ERROR(As2D(x, "x", &t[0]));
  JMX_RETURN_IF_ERROR(CheckBlockable(t[0], "x"));
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "elem_dtype", data->element_type(), "data"));
  const int64_t m = t[0].rows, k = t[0].cols;
  int64_t sm = 0, sk = 0;
  ScaleShape(static_cast<int>(mode), m, k, &sm, &sk);
  JMX_RETURN_IF_ERROR(As2D(data, "data", &t[1]));
  JMX_RETURN_IF_ERROR(Expect(t[1], data->element_type(), data->element_type(), m, k, "data"));
  JMX_RETURN_IF_ERROR(As2D(scale, "scale", &t[2]));
  JMX_RETURN_IF_ERROR(Expect(t[2], scale->element_type(), ffi::DataType::U8, sm, sk, "scale"));
  if (m == 0 || k == 0) return ffi::Error::Success();
  return Launch(entry, device, t, 3, stream);
}

ffi::Error DequantizeImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer data, ffi::AnyBuffer scale,
                          ffi::Result<ffi::AnyBuffer> out, std::string_view kernel) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, "dequantize", kernel, &entry));
  const int64_t block = Param(entry, "block");  // decides the scale shape (the registry has no rowcol here)
  TensorView t[3];
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "elem_dtype", data.element_type(), "data"));
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "out_dtype", out->element_type(), "output"));
  JMX_RETURN_IF_ERROR(As2D(data, "data", &t[0]));
  JMX_RETURN_IF_ERROR(CheckBlockable(t[0], "data"));
  const int64_t m = t[0].rows, k = t[0].cols;
  int64_t sm = 0, sk = 0;
  ScaleShape(static_cast<int>(block), m, k, &sm, &sk);
  JMX_RETURN_IF_ERROR(As2D(scale, "scale", &t[1]));
  JMX_RETURN_IF_ERROR(Expect(t[1], scale.element_type(), ffi::DataType::U8, sm, sk, "scale"));
  JMX_RETURN_IF_ERROR(As2D(out, "output", &t[2]));
  JMX_RETURN_IF_ERROR(Expect(t[2], out->element_type(), out->element_type(), m, k, "output"));
  if (m == 0 || k == 0) return ffi::Error::Success();
  return Launch(entry, device, t, 3, stream);
}

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

// The FFI handler symbols are part of the library's public C ABI: compiled with default visibility (the
// rest of the library is -fvisibility=hidden) and matched by csrc/exports.map (jax_mxfp8_*).
#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_quantize_rowcol, jmx::QuantizeRowColImpl,
                              (jmx::BindBuffers<1, 4>()
                                  .Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_quantize_rowcol);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_quantize, jmx::QuantizeImpl,
                              (jmx::BindBuffers<1, 2>()
                                  .Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_quantize);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_dequantize, jmx::DequantizeImpl,
                              (jmx::BindBuffers<2, 1>()
                                  .Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_dequantize);

#pragma GCC visibility pop
