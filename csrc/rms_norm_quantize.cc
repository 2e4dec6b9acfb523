// XLA FFI handler for the fused RMSNorm + MX quantize kernel (jax_mxfp8/kernels/common/rms_norm_quantize.py).
//
//   jax_mxfp8_rms_norm_quantize  (x, weight) -> (y, data, scale)
//     attrs: eps (f32); kernel (string) = the registry variant name, e.g. "rms_norm_quantize_bf16_e4m3_up"
//     (the variant fixes x's dtype, the element format and the scale rounding; the handler checks them)
//
// x: rank >= 2 (the primitive reshapes rank-1 input), bf16 or f32, viewed as (M, D) with leading axes
// flattened; D a multiple of 32 and at most the variant's limit (KernelEntry::max_cols). weight: f32 of
// shape (D,). y: x's shape and dtype. data: x's shape, f8e4m3fn / f8e5m2 (selects the element format).
// scale: (M, D / 32) u8 (leading axes flattened). Every failure is returned as an ffi::Error; the
// handler only enqueues work on XLA's stream (CUDA-graph compatible).
//
//   jax_mxfp8_rms_norm_quantize_blocked  (x, weight) -> (y, data, scale): the blocked-scale variants
//     (RMSNormQuantizeBlockedConfig, Blackwell sm_100f, e.g. "rms_norm_quantize_blocked_bf16_e4m3_up"): x of
//     rank >= 2 viewed as (G, R, D) (G the leading axes but the last, R the last but one); scale (G,
//     ceil(R/128), ceil(D/128), 512) u8 in the 128x4 blocked layout. The handler zero-fills scale
//     (cudaMemsetAsync: the layout's padding bytes) and launches the kernel on a (R, G) grid.
#include <string>
#include <string_view>

#include "common.h"

namespace jmx {
namespace {

ffi::Error Run(cudaStream_t stream, int32_t device, bool blocked, ffi::AnyBuffer x, ffi::AnyBuffer weight,
               ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> data, ffi::Result<ffi::AnyBuffer> scale,
               float eps, std::string_view kernel) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, "rms_norm_quantize", kernel, &entry));
  const bool variant_blocked = Param(entry, "blocked_scales") == 1;
  if (variant_blocked != blocked) {
    return ffi::Error::InvalidArgument(std::string("jax_mxfp8: rms_norm_quantize kernel '") + entry->name +
                                       (variant_blocked ? "' writes blocked scales (use jax_mxfp8_rms_norm_quantize_blocked)"
                                                        : "' writes natural scales (use jax_mxfp8_rms_norm_quantize)"));
  }
  TensorView t[5];
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "in_dtype", x.element_type(), "x"));
  JMX_RETURN_IF_ERROR(As2D(x, "x", &t[0]));
  const int64_t m = t[0].rows, d = t[0].cols;
  if (d % 32 != 0) {
    return ffi::Error::InvalidArgument("jax_mxfp8: rms_norm_quantize needs the last dimension of x to be a multiple "
                                       "of 32, got " + std::to_string(d));
  }
  // weight: f32 (D,), viewed as (1, D)
  if (weight.element_type() != ffi::DataType::F32) {
    return ffi::Error::InvalidArgument("jax_mxfp8: weight has dtype " + DTypeName(weight.element_type()) +
                                       ", expected f32");
  }
  auto wdims = weight.dimensions();
  if (wdims.size() != 1 || wdims[0] != d) {
    return ffi::Error::InvalidArgument("jax_mxfp8: weight must have shape (" + std::to_string(d) + ",)");
  }
  if (reinterpret_cast<uintptr_t>(weight.untyped_data()) % 16 != 0) {
    return ffi::Error::InvalidArgument("jax_mxfp8: weight is not 16-byte aligned");
  }
  t[1] = TensorView{weight.untyped_data(), 1, static_cast<int32_t>(d)};
  JMX_RETURN_IF_ERROR(As2D(y, "y", &t[2]));
  JMX_RETURN_IF_ERROR(Expect(t[2], y->element_type(), x.element_type(), m, d, "y"));
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "elem_dtype", data->element_type(), "data"));
  JMX_RETURN_IF_ERROR(As2D(data, "data", &t[3]));
  JMX_RETURN_IF_ERROR(Expect(t[3], data->element_type(), data->element_type(), m, d, "data"));
  if (blocked) {
    // x (..., R, D) as (G, R, D); scale (G, ceil(R/128), ceil(D/128), 512), viewed as (G, tiles * 512)
    auto xd = x.dimensions();
    const int64_t r = xd[xd.size() - 2], g = r > 0 ? m / r : 0;
    const int64_t tiles = (r + 127) / 128 * ((d + 127) / 128);
    auto sd = scale->dimensions();
    const bool shape_ok = sd.size() == xd.size() + 1 && sd[sd.size() - 3] == (r + 127) / 128 &&
                          sd[sd.size() - 2] == (d + 127) / 128 && sd[sd.size() - 1] == 512;
    bool lead_ok = shape_ok;
    for (size_t i = 0; lead_ok && i + 2 < xd.size(); ++i) lead_ok = sd[i] == xd[i];
    if (!lead_ok || scale->element_type() != ffi::DataType::U8) {
      return ffi::Error::InvalidArgument("jax_mxfp8: scale must be u8 of x's leading axes + (" +
                                         std::to_string((r + 127) / 128) + ", " + std::to_string((d + 127) / 128) +
                                         ", 512) (the blocked layout)");
    }
    if (g > 65535 || tiles * 512 > INT32_MAX) {
      return ffi::Error::InvalidArgument("jax_mxfp8: rms_norm_quantize (blocked): x has too many rows for the kernel");
    }
    t[4] = TensorView{scale->untyped_data(), static_cast<int32_t>(g), static_cast<int32_t>(tiles * 512)};
    if (m == 0 || d == 0) return ffi::Error::Success();
    if (cudaError_t err = cudaMemsetAsync(scale->untyped_data(), 0, static_cast<size_t>(g * tiles * 512), stream);
        err != cudaSuccess) {
      return ffi::Error::Internal(std::string("jax_mxfp8: rms_norm_quantize: cudaMemsetAsync: ") +
                                  cudaGetErrorString(err));
    }
  } else {
    JMX_RETURN_IF_ERROR(As2D(scale, "scale", &t[4]));
    JMX_RETURN_IF_ERROR(Expect(t[4], scale->element_type(), ffi::DataType::U8, m, d / 32, "scale"));
  }
  if (m == 0 || d == 0) return ffi::Error::Success();
  if (entry->max_cols > 0 && d > entry->max_cols) {
    return ffi::Error::InvalidArgument("jax_mxfp8: rms_norm_quantize kernel " + std::string(entry->name) +
                                       " supports D <= " + std::to_string(entry->max_cols) + ", got " +
                                       std::to_string(d) + " (use implementation='xla')");
  }
  const float scalars[1] = {eps};
  return Launch(entry, device, t, 5, stream, scalars, 1);
}

ffi::Error RmsNormQuantizeImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer weight,
                               ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> data,
                               ffi::Result<ffi::AnyBuffer> scale, float eps, std::string_view kernel) {
  return Run(stream, device, false, x, weight, y, data, scale, eps, kernel);
}

ffi::Error RmsNormQuantizeBlockedImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer weight,
                                      ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> data,
                                      ffi::Result<ffi::AnyBuffer> scale, float eps, std::string_view kernel) {
  return Run(stream, device, true, x, weight, y, data, scale, eps, kernel);
}

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_rms_norm_quantize, jmx::RmsNormQuantizeImpl,
                              (jmx::BindBuffers<2, 3>()
                                  .Attr<float>("eps")
                                  .Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_rms_norm_quantize);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_rms_norm_quantize_blocked, jmx::RmsNormQuantizeBlockedImpl,
                              (jmx::BindBuffers<2, 3>()
                                  .Attr<float>("eps")
                                  .Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_rms_norm_quantize_blocked);

#pragma GCC visibility pop
