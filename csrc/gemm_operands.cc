// XLA FFI handlers for the GEMM operand producer (jax_mxfp8/kernels/common/gemm_operands.py): MX quantize +
// align128 of x (G, R, C) in one pass.
//
//   jax_mxfp8_gemm_operands       x -> (data, scale)                               a "row" or "col" variant
//   jax_mxfp8_gemm_operands_both  x -> (row data, row scale, col data, col scale)  a "both" variant
//   jax_mxfp8_gemm_operands{,_both}_into   the same with the results passed as extra operands, aliased to
//                                          the results (test hook: NaN-filled outputs must be fully written)
//   attribute: kernel (string) = the registry variant name, e.g. "gemm_operands_both_bf16_e4m3_up".
//
// Buffers (Rp, Cp = R, C rounded up to 128; R, C multiples of 32):
//   x          (G, R, C)        bf16 / f32 (the variant's in_dtype)
//   row data   (G, R, Cp)       f8 (elem_dtype)     row scale (G, Cp/128, R) f32
//   col data   (G, C, Rp)       f8 (elem_dtype)     col scale (G, Rp/128, C) f32
// The kernel gets 2-D views with the leading axes flattened. Every failure is returned as an ffi::Error; the
// handlers only enqueue work on XLA's stream (CUDA-graph compatible).
#include <string>
#include <string_view>

#include "common.h"

namespace jmx {
namespace {

constexpr int64_t kRun = 128;
enum Orientation : int { kOrientRow = 0, kOrientCol = 1, kOrientBoth = 2 };

ffi::Error Want(bool ok, const std::string& msg) { return jmx::Want(ok, "gemm_operands", msg); }

std::string Shape3(int64_t a, int64_t b, int64_t c) {
  return "(" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + ")";
}

// Checks one output pair (data, scale) of an orientation whose contracting axis has size k and whose other
// axis has size n: data (G, n, kp), scale (G, kp/128, n).
ffi::Error CheckPair(const KernelEntry* entry, const ffi::AnyBuffer& data, const ffi::AnyBuffer& scale, int64_t g,
                     int64_t n, int64_t k, const char* what) {
  const int64_t kp = (k + kRun - 1) / kRun * kRun;
  int64_t d[3], s[3];
  const std::string w(what);
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "elem_dtype", data.element_type(), (w + " data").c_str()));
  JMX_RETURN_IF_ERROR(Dims(data, "gemm_operands", (w + " data").c_str(), 3, d));
  JMX_RETURN_IF_ERROR(Want(d[0] == g && d[1] == n && d[2] == kp,
                           w + " data must be " + Shape3(g, n, kp) + ", got " + Shape3(d[0], d[1], d[2])));
  JMX_RETURN_IF_ERROR(Want(scale.element_type() == ffi::DataType::F32, w + " scale must be float32"));
  JMX_RETURN_IF_ERROR(Dims(scale, "gemm_operands", (w + " scale").c_str(), 3, s));
  JMX_RETURN_IF_ERROR(Want(s[0] == g && s[1] == kp / kRun && s[2] == n,
                           w + " scale must be " + Shape3(g, kp / kRun, n) + ", got " + Shape3(s[0], s[1], s[2])));
  return ffi::Error::Success();
}

// x and the outputs in the kernel's argument order (x, then row pair and/or col pair); n_out is 2 or 4.
ffi::Error Run(cudaStream_t stream, int32_t device, std::string_view kernel, int want_orient, ffi::AnyBuffer x,
               ffi::AnyBuffer* outs, int n_out) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, "gemm_operands", kernel, &entry));
  const int64_t orient = Param(entry, "orientations");
  if (want_orient == kOrientBoth) {
    JMX_RETURN_IF_ERROR(Want(orient == kOrientBoth, std::string("kernel '") + entry->name +
                                                        "' is not a 'both' variant (use jax_mxfp8_gemm_operands)"));
  } else {
    JMX_RETURN_IF_ERROR(Want(orient == kOrientRow || orient == kOrientCol,
                             std::string("kernel '") + entry->name +
                                 "' is a 'both' variant (use jax_mxfp8_gemm_operands_both)"));
  }
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "in_dtype", x.element_type(), "x"));
  int64_t xd[3];
  JMX_RETURN_IF_ERROR(Dims(x, "gemm_operands", "x", 3, xd));
  const int64_t g = xd[0], r = xd[1], c = xd[2];
  JMX_RETURN_IF_ERROR(Want(r % 32 == 0 && c % 32 == 0,
                           "x is " + Shape3(g, r, c) + "; the kernel needs R and C multiples of 32"));
  const int64_t rp = (r + kRun - 1) / kRun * kRun;
  JMX_RETURN_IF_ERROR(Want(g <= 65535 && rp / kRun <= 65535, "x is " + Shape3(g, r, c) +
                                                                  "; the grid needs G <= 65535 and R <= 65535 * 128"));
  const bool row = orient == kOrientRow || orient == kOrientBoth;
  const bool col = orient == kOrientCol || orient == kOrientBoth;
  int o = 0;
  if (row) {
    JMX_RETURN_IF_ERROR(CheckPair(entry, outs[o], outs[o + 1], g, r, c, "row"));
    o += 2;
  }
  if (col) JMX_RETURN_IF_ERROR(CheckPair(entry, outs[o], outs[o + 1], g, c, r, "col"));
  if (g == 0 || r == 0 || c == 0) return ffi::Error::Success();
  TensorView t[5];
  JMX_RETURN_IF_ERROR(As2D(x, "x", &t[0]));
  static const char* const kNames[] = {"data", "scale", "data", "scale"};
  for (int i = 0; i < n_out; ++i) JMX_RETURN_IF_ERROR(As2D(outs[i], kNames[i], &t[i + 1]));
  return Launch(entry, device, t, n_out + 1, stream);
}

ffi::Error Single(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                  ffi::Result<ffi::AnyBuffer> scale, std::string_view kernel) {
  ffi::AnyBuffer outs[2] = {*data, *scale};
  return Run(stream, device, kernel, kOrientRow, x, outs, 2);
}

ffi::Error Both(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> row_data,
                ffi::Result<ffi::AnyBuffer> row_scale, ffi::Result<ffi::AnyBuffer> col_data,
                ffi::Result<ffi::AnyBuffer> col_scale, std::string_view kernel) {
  ffi::AnyBuffer outs[4] = {*row_data, *row_scale, *col_data, *col_scale};
  return Run(stream, device, kernel, kOrientBoth, x, outs, 4);
}

// _into hooks: the output operands are aliased to the results; the kernel writes the results.
ffi::Error SingleInto(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer, ffi::AnyBuffer,
                      ffi::Result<ffi::AnyBuffer> data, ffi::Result<ffi::AnyBuffer> scale, std::string_view kernel) {
  return Single(stream, device, x, data, scale, kernel);
}

ffi::Error BothInto(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer, ffi::AnyBuffer,
                    ffi::AnyBuffer, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer> row_data,
                    ffi::Result<ffi::AnyBuffer> row_scale, ffi::Result<ffi::AnyBuffer> col_data,
                    ffi::Result<ffi::AnyBuffer> col_scale, std::string_view kernel) {
  return Both(stream, device, x, row_data, row_scale, col_data, col_scale, kernel);
}

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_gemm_operands, jmx::Single,
                              (jmx::BindBuffers<1, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_gemm_operands);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_gemm_operands_both, jmx::Both,
                              (jmx::BindBuffers<1, 4>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_gemm_operands_both);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_gemm_operands_into, jmx::SingleInto,
                              (jmx::BindBuffers<3, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_gemm_operands_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_gemm_operands_both_into, jmx::BothInto,
                              (jmx::BindBuffers<5, 4>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_gemm_operands_both_into);

#pragma GCC visibility pop
