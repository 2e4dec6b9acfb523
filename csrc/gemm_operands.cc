// XLA FFI handlers for the MX GEMMs' operand producers: MX quantize of x (G, R, C) in one pass.
//
// Hopper (jax_mxfp8/kernels/common/gemm_operands.py, registry op "gemm_operands"): quantize + align128.
//   jax_mxfp8_gemm_operands       x -> (data, scale)                               a "row" or "col" variant
//   jax_mxfp8_gemm_operands_both  x -> (row data, row scale, col data, col scale)  a "both" variant
//   attribute: kernel (string) = the registry variant name, e.g. "gemm_operands_both_bf16_e4m3_up".
//   Buffers (Rp, Cp = R, C rounded up to 128; R, C multiples of 32):
//     x          (G, R, C)        bf16 / f32 (the variant's in_dtype)
//     row data   (G, R, Cp)       f8 (elem_dtype)     row scale (G, Cp/128, R) f32
//     col data   (G, C, Rp)       f8 (elem_dtype)     col scale (G, Rp/128, C) f32
//   The kernel gets 2-D views with the leading axes flattened.
//
// Blackwell (jax_mxfp8/kernels/sm100/blocked_operands.py, registry op "blocked_operands", sm_100f; NOT RUN ON
// HARDWARE by this project): MX quantize, the E8M0 scales in the 128x4 blocked layout.
//   jax_mxfp8_blocked_operands, jax_mxfp8_blocked_operands_both: as above, e.g. "blocked_operands_row_bf16_e4m3_up"
//   Buffers (Rt, Ct = ceil(R / 128), ceil(C / 128)):
//     row data   (G, R, C)        f8 (elem_dtype)     row scale (G, Rt, Ct, 512) u8: blocks along C
//     col data   (G, C, R)        f8 (elem_dtype)     col scale (G, Ct, Rt, 512) u8: blocks along R
//   The kernel gets 2-D views: x, row data (G*R, C); col data (G*C, R); each scale (G, tiles * 512).
//
// Each with _into test hooks (<target>_into): the results passed as extra operands, aliased to the results
// (NaN-filled outputs must be fully written). Every failure is returned as an ffi::Error; the handlers only
// enqueue work on XLA's stream (CUDA-graph compatible).
#include <initializer_list>
#include <string>
#include <string_view>

#include "common.h"

namespace jmx {
namespace {

constexpr int64_t kRun = 128;
constexpr int64_t kTileBytes = 512;
enum Orientation : int { kOrientRow = 0, kOrientCol = 1, kOrientBoth = 2 };  // registry ORIENTATION_CODE

// One producer family: its registry op, its targets' names (for the error messages), its output layout.
struct Family {
  std::string_view op;
  const char* single_target;
  const char* both_target;
  bool blocked;
};
constexpr Family kAligned{"gemm_operands", "jax_mxfp8_gemm_operands", "jax_mxfp8_gemm_operands_both", false};
constexpr Family kBlocked{"blocked_operands", "jax_mxfp8_blocked_operands", "jax_mxfp8_blocked_operands_both", true};

std::string Shape(std::initializer_list<int64_t> d) {
  std::string out = "(";
  int i = 0;
  for (int64_t v : d) out += (i++ ? ", " : "") + std::to_string(v);
  return out + ")";
}

int64_t Tiles(int64_t x) { return (x + kRun - 1) / kRun; }

// Checks one output pair of an orientation whose contracting axis has size k and whose other axis has size n,
// and fills the kernel's two views (t[0], t[1]) when the call is not empty:
//   aligned: data (G, n, kp), scale (G, kp/128, n) f32 (kp = k rounded up to 128)
//   blocked: data (G, n, k), scale (G, ceil(n/128), ceil(k/128), 512) u8, viewed as (G, tiles * 512)
ffi::Error CheckPair(const Family& family, const KernelEntry* entry, const ffi::AnyBuffer& data,
                     const ffi::AnyBuffer& scale, int64_t g, int64_t n, int64_t k, const char* what, TensorView* t) {
  const std::string w(what);
  auto want = [&](bool ok, const std::string& msg) { return Want(ok, family.op, msg); };
  const int64_t kp = family.blocked ? k : Tiles(k) * kRun;
  int64_t d[3];
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "elem_dtype", data.element_type(), (w + " data").c_str()));
  JMX_RETURN_IF_ERROR(Dims(data, family.op, (w + " data").c_str(), 3, d));
  JMX_RETURN_IF_ERROR(want(d[0] == g && d[1] == n && d[2] == kp,
                           w + " data must be " + Shape({g, n, kp}) + ", got " + Shape({d[0], d[1], d[2]})));
  const bool empty = g == 0 || n == 0 || k == 0;
  if (family.blocked) {
    int64_t s[4];
    JMX_RETURN_IF_ERROR(want(scale.element_type() == ffi::DataType::U8, w + " scale must be uint8"));
    JMX_RETURN_IF_ERROR(Dims(scale, family.op, (w + " scale").c_str(), 4, s));
    JMX_RETURN_IF_ERROR(want(s[0] == g && s[1] == Tiles(n) && s[2] == Tiles(k) && s[3] == kTileBytes,
                             w + " scale must be " + Shape({g, Tiles(n), Tiles(k), kTileBytes}) + ", got " +
                                 Shape({s[0], s[1], s[2], s[3]})));
    if (empty) return ffi::Error::Success();
    const int64_t cols = Tiles(n) * Tiles(k) * kTileBytes;
    JMX_RETURN_IF_ERROR(want(cols <= INT32_MAX, w + " scale is too large for the kernel"));
    JMX_RETURN_IF_ERROR(want(reinterpret_cast<uintptr_t>(scale.untyped_data()) % 16 == 0,
                             w + " scale is not 16-byte aligned"));
    t[1] = TensorView{scale.untyped_data(), static_cast<int32_t>(g), static_cast<int32_t>(cols)};
  } else {
    int64_t s[3];
    JMX_RETURN_IF_ERROR(want(scale.element_type() == ffi::DataType::F32, w + " scale must be float32"));
    JMX_RETURN_IF_ERROR(Dims(scale, family.op, (w + " scale").c_str(), 3, s));
    JMX_RETURN_IF_ERROR(want(s[0] == g && s[1] == kp / kRun && s[2] == n,
                             w + " scale must be " + Shape({g, kp / kRun, n}) + ", got " + Shape({s[0], s[1], s[2]})));
    if (empty) return ffi::Error::Success();
    JMX_RETURN_IF_ERROR(As2D(scale, (w + " scale").c_str(), &t[1]));
  }
  return As2D(data, (w + " data").c_str(), &t[0]);
}

// x and the outputs in the kernel's argument order (x, then the row pair and/or the col pair); n_out 2 or 4.
ffi::Error Run(const Family& family, cudaStream_t stream, int32_t device, std::string_view kernel, int want_orient,
               ffi::AnyBuffer x, ffi::AnyBuffer* outs, int n_out) {
  auto want = [&](bool ok, const std::string& msg) { return Want(ok, family.op, msg); };
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, family.op, kernel, &entry));
  const int64_t orient = Param(entry, "orientations");
  if (want_orient == kOrientBoth) {
    JMX_RETURN_IF_ERROR(want(orient == kOrientBoth, std::string("kernel '") + entry->name +
                                                        "' is not a 'both' variant (use " + family.single_target + ")"));
  } else {
    JMX_RETURN_IF_ERROR(want(orient == kOrientRow || orient == kOrientCol, std::string("kernel '") + entry->name +
                                                                               "' is a 'both' variant (use " +
                                                                               family.both_target + ")"));
  }
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "in_dtype", x.element_type(), "x"));
  int64_t xd[3];
  JMX_RETURN_IF_ERROR(Dims(x, family.op, "x", 3, xd));
  const int64_t g = xd[0], r = xd[1], c = xd[2];
  JMX_RETURN_IF_ERROR(want(r % 32 == 0 && c % 32 == 0,
                           "x is " + Shape({g, r, c}) + "; the kernel needs R and C multiples of 32"));
  JMX_RETURN_IF_ERROR(want(g <= 65535 && Tiles(r) <= 65535, "x is " + Shape({g, r, c}) +
                                                                "; the grid needs G <= 65535 and R <= 65535 * 128"));
  const bool row = orient == kOrientRow || orient == kOrientBoth;
  const bool col = orient == kOrientCol || orient == kOrientBoth;
  TensorView t[5];
  int o = 0;
  if (row) {
    JMX_RETURN_IF_ERROR(CheckPair(family, entry, outs[o], outs[o + 1], g, r, c, "row", &t[o + 1]));
    o += 2;
  }
  if (col) JMX_RETURN_IF_ERROR(CheckPair(family, entry, outs[o], outs[o + 1], g, c, r, "col", &t[o + 1]));
  if (g == 0 || r == 0 || c == 0) return ffi::Error::Success();
  JMX_RETURN_IF_ERROR(As2D(x, "x", &t[0]));
  return Launch(entry, device, t, n_out + 1, stream);
}

template <const Family& F>
ffi::Error Single(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                  ffi::Result<ffi::AnyBuffer> scale, std::string_view kernel) {
  ffi::AnyBuffer outs[2] = {*data, *scale};
  return Run(F, stream, device, kernel, kOrientRow, x, outs, 2);
}

template <const Family& F>
ffi::Error Both(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> row_data,
                ffi::Result<ffi::AnyBuffer> row_scale, ffi::Result<ffi::AnyBuffer> col_data,
                ffi::Result<ffi::AnyBuffer> col_scale, std::string_view kernel) {
  ffi::AnyBuffer outs[4] = {*row_data, *row_scale, *col_data, *col_scale};
  return Run(F, stream, device, kernel, kOrientBoth, x, outs, 4);
}

// _into hooks: the output operands are aliased to the results; the kernel writes the results.
template <const Family& F>
ffi::Error SingleInto(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer, ffi::AnyBuffer,
                      ffi::Result<ffi::AnyBuffer> data, ffi::Result<ffi::AnyBuffer> scale, std::string_view kernel) {
  return Single<F>(stream, device, x, data, scale, kernel);
}

template <const Family& F>
ffi::Error BothInto(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer, ffi::AnyBuffer,
                    ffi::AnyBuffer, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer> row_data,
                    ffi::Result<ffi::AnyBuffer> row_scale, ffi::Result<ffi::AnyBuffer> col_data,
                    ffi::Result<ffi::AnyBuffer> col_scale, std::string_view kernel) {
  return Both<F>(stream, device, x, row_data, row_scale, col_data, col_scale, kernel);
}

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_gemm_operands, (jmx::Single<jmx::kAligned>),
                              (jmx::BindBuffers<1, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_gemm_operands);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_gemm_operands_both, (jmx::Both<jmx::kAligned>),
                              (jmx::BindBuffers<1, 4>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_gemm_operands_both);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_gemm_operands_into, (jmx::SingleInto<jmx::kAligned>),
                              (jmx::BindBuffers<3, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_gemm_operands_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_gemm_operands_both_into, (jmx::BothInto<jmx::kAligned>),
                              (jmx::BindBuffers<5, 4>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_gemm_operands_both_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_blocked_operands, (jmx::Single<jmx::kBlocked>),
                              (jmx::BindBuffers<1, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_blocked_operands);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_blocked_operands_both, (jmx::Both<jmx::kBlocked>),
                              (jmx::BindBuffers<1, 4>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_blocked_operands_both);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_blocked_operands_into, (jmx::SingleInto<jmx::kBlocked>),
                              (jmx::BindBuffers<3, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_blocked_operands_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_blocked_operands_both_into, (jmx::BothInto<jmx::kBlocked>),
                              (jmx::BindBuffers<5, 4>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_blocked_operands_both_into);

#pragma GCC visibility pop
