// XLA FFI handlers for the Blackwell MX GEMM's operand producer (jax_mxfp8/kernels/sm100/blocked_operands.py,
// registry op "blocked_operands", sm_100f): MX quantize of x (G, R, C) in one pass, the E8M0 scales in the
// 128x4 blocked layout. NOT RUN ON HARDWARE by this project.
//
//   jax_mxfp8_blocked_operands       x -> (data, scale)                               a "row" or "col" variant
//   jax_mxfp8_blocked_operands_both  x -> (row data, row scale, col data, col scale)  a "both" variant
//   jax_mxfp8_blocked_operands{,_both}_into   the same with the results passed as extra operands, aliased to
//                                             the results (test hook: NaN-filled outputs must be fully written)
//   attribute: kernel (string) = the registry variant name, e.g. "blocked_operands_both_bf16_e4m3_up".
//
// Buffers (R, C multiples of 32; Rt, Ct = ceil(R / 128), ceil(C / 128)):
//   x          (G, R, C)              bf16 / f32 (the variant's in_dtype)
//   row data   (G, R, C)              f8 (elem_dtype)     row scale (G, Rt, Ct, 512) u8: blocks along C
//   col data   (G, C, R)              f8 (elem_dtype)     col scale (G, Ct, Rt, 512) u8: blocks along R
// The kernel gets 2-D views: x, row data (G*R, C); col data (G*C, R); each scale (G, tiles * 512). Every
// failure is returned as an ffi::Error; the handlers only enqueue work on XLA's stream (CUDA-graph compatible).
#include <string>
#include <string_view>

#include "common.h"

namespace jmx {
namespace {

constexpr std::string_view kOp = "blocked_operands";
constexpr int64_t kTile = 128;
constexpr int64_t kTileBytes = 512;
enum Orientation : int { kOrientRow = 0, kOrientCol = 1, kOrientBoth = 2 };  // registry ORIENTATION_CODE

ffi::Error Want(bool ok, const std::string& msg) { return jmx::Want(ok, kOp, msg); }

std::string Shape(std::initializer_list<int64_t> d) {
  std::string out = "(";
  int i = 0;
  for (int64_t v : d) out += (i++ ? ", " : "") + std::to_string(v);
  return out + ")";
}

int64_t Tiles(int64_t x) { return (x + kTile - 1) / kTile; }

// Checks one output pair of an orientation whose data is (G, n, k) (k the blocked, contracting axis):
// data (G, n, k) elem_dtype, scale (G, ceil(n/128), ceil(k/128), 512) u8; fills their kernel views.
ffi::Error CheckPair(const KernelEntry* entry, const ffi::AnyBuffer& data, const ffi::AnyBuffer& scale, int64_t g,
                     int64_t n, int64_t k, const char* what, TensorView* t) {
  const std::string w(what);
  int64_t d[3], s[4];
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "elem_dtype", data.element_type(), (w + " data").c_str()));
  JMX_RETURN_IF_ERROR(Dims(data, kOp, (w + " data").c_str(), 3, d));
  JMX_RETURN_IF_ERROR(Want(d[0] == g && d[1] == n && d[2] == k,
                           w + " data must be " + Shape({g, n, k}) + ", got " + Shape({d[0], d[1], d[2]})));
  JMX_RETURN_IF_ERROR(Want(scale.element_type() == ffi::DataType::U8, w + " scale must be uint8"));
  JMX_RETURN_IF_ERROR(Dims(scale, kOp, (w + " scale").c_str(), 4, s));
  JMX_RETURN_IF_ERROR(Want(s[0] == g && s[1] == Tiles(n) && s[2] == Tiles(k) && s[3] == kTileBytes,
                           w + " scale must be " + Shape({g, Tiles(n), Tiles(k), kTileBytes}) + ", got " +
                               Shape({s[0], s[1], s[2], s[3]})));
  if (g == 0 || n == 0 || k == 0) return ffi::Error::Success();
  JMX_RETURN_IF_ERROR(As2D(data, (w + " data").c_str(), &t[0]));
  const int64_t scale_cols = Tiles(n) * Tiles(k) * kTileBytes;
  JMX_RETURN_IF_ERROR(Want(scale_cols <= INT32_MAX && g <= INT32_MAX, w + " scale is too large for the kernel"));
  JMX_RETURN_IF_ERROR(Want(reinterpret_cast<uintptr_t>(scale.untyped_data()) % 16 == 0,
                           w + " scale is not 16-byte aligned"));
  t[1] = TensorView{scale.untyped_data(), static_cast<int32_t>(g), static_cast<int32_t>(scale_cols)};
  return ffi::Error::Success();
}

// x and the outputs in the kernel's argument order (x, then the row pair and/or the col pair); n_out 2 or 4.
ffi::Error Run(cudaStream_t stream, int32_t device, std::string_view kernel, int want_orient, ffi::AnyBuffer x,
               ffi::AnyBuffer* outs, int n_out) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOp, kernel, &entry));
  const int64_t orient = Param(entry, "orientations");
  if (want_orient == kOrientBoth) {
    JMX_RETURN_IF_ERROR(Want(orient == kOrientBoth, std::string("kernel '") + entry->name +
                                                        "' is not a 'both' variant (use jax_mxfp8_blocked_operands)"));
  } else {
    JMX_RETURN_IF_ERROR(Want(orient == kOrientRow || orient == kOrientCol,
                             std::string("kernel '") + entry->name +
                                 "' is a 'both' variant (use jax_mxfp8_blocked_operands_both)"));
  }
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "in_dtype", x.element_type(), "x"));
  int64_t xd[3];
  JMX_RETURN_IF_ERROR(Dims(x, kOp, "x", 3, xd));
  const int64_t g = xd[0], r = xd[1], c = xd[2];
  JMX_RETURN_IF_ERROR(Want(r % 32 == 0 && c % 32 == 0,
                           "x is " + Shape({g, r, c}) + "; the kernel needs R and C multiples of 32"));
  JMX_RETURN_IF_ERROR(Want(g <= 65535 && Tiles(r) <= 65535, "x is " + Shape({g, r, c}) +
                                                                "; the grid needs G <= 65535 and R <= 65535 * 128"));
  const bool row = orient == kOrientRow || orient == kOrientBoth;
  const bool col = orient == kOrientCol || orient == kOrientBoth;
  TensorView t[5];
  int o = 0;
  if (row) {
    JMX_RETURN_IF_ERROR(CheckPair(entry, outs[o], outs[o + 1], g, r, c, "row", &t[o + 1]));
    o += 2;
  }
  if (col) JMX_RETURN_IF_ERROR(CheckPair(entry, outs[o], outs[o + 1], g, c, r, "col", &t[o + 1]));
  if (g == 0 || r == 0 || c == 0) return ffi::Error::Success();
  JMX_RETURN_IF_ERROR(As2D(x, "x", &t[0]));
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_blocked_operands, jmx::Single,
                              (jmx::BindBuffers<1, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_blocked_operands);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_blocked_operands_both, jmx::Both,
                              (jmx::BindBuffers<1, 4>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_blocked_operands_both);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_blocked_operands_into, jmx::SingleInto,
                              (jmx::BindBuffers<3, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_blocked_operands_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_blocked_operands_both_into, jmx::BothInto,
                              (jmx::BindBuffers<5, 4>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_blocked_operands_both_into);

#pragma GCC visibility pop
