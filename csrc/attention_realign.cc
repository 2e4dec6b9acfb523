// XLA FFI handler for the attention producer's re-encode + transpose (jax_mxfp8/kernels/sm90/attention_realign.py).
//
//   jax_mxfp8_attention_realign  (data, shift) -> out
//     attribute: kernel (string) = the registry variant name, "attention_realign_{rows,v}_h{64,128}" (the
//     variant fixes the operand, Q/K rows or V^T, and the head_dim the handler checks the shapes with)
//
// The primitive passes 2-D views (jax_mxfp8/primitives/attention_fwd.py, `realign`):
//   data  (B, L*N*H) f8e4m3fn   the sequence-major (B, L, N, H) square-block MX elements
//   shift (B, L/32*N*H/32) s8   the per-block exponent shift (B, L/32, N, H/32)
//   out   (B*N, Lp*H) f8e4m3fn  (B, N, Lp, H) for operand 0, (B, N, H, Lp) for operand 1
// with L a multiple of 32, Lp = L rounded up to 128 and H = head_dim (64 or 128). Every failure is returned
// as an ffi::Error; the handler only enqueues work on XLA's stream (CUDA-graph compatible).
#include <string>
#include <string_view>

#include "common.h"

namespace jmx {
namespace {

// common.h's check, bound to this op's name for the error messages
ffi::Error Want(bool ok, const std::string& msg) { return jmx::Want(ok, "attention_realign", msg); }

ffi::Error AttentionRealignImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer data, ffi::AnyBuffer shift,
                                ffi::Result<ffi::AnyBuffer> out, std::string_view kernel) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, "attention_realign", kernel, &entry));
  const int64_t head_dim = Param(entry, "head_dim");  // both operands' layouts follow from it (see above)
  JMX_RETURN_IF_ERROR(Want(data.element_type() == ffi::DataType::F8E4M3FN &&
                               out->element_type() == ffi::DataType::F8E4M3FN,
                           "data and out must be f8e4m3fn"));
  JMX_RETURN_IF_ERROR(Want(shift.element_type() == ffi::DataType::S8, "shift must be s8"));
  TensorView t[3];
  JMX_RETURN_IF_ERROR(As2D(data, "data", &t[0]));
  JMX_RETURN_IF_ERROR(As2D(shift, "shift", &t[1]));
  JMX_RETURN_IF_ERROR(As2D(out, "out", &t[2]));
  const int64_t b = t[0].rows, h = head_dim;
  if (b == 0 || t[0].cols == 0) return ffi::Error::Success();
  JMX_RETURN_IF_ERROR(Want(t[2].rows % b == 0, "out must have B*N rows"));
  const int64_t n = t[2].rows / b;
  JMX_RETURN_IF_ERROR(Want(n > 0 && t[0].cols % (32 * n * h) == 0, "data must be (B, L*N*H) with 32 | L"));
  const int64_t len = t[0].cols / (n * h), lp = (len + 127) / 128 * 128;
  JMX_RETURN_IF_ERROR(Want(t[1].rows == b && t[1].cols == t[0].cols / 1024, "shift must be (B, L/32*N*H/32)"));
  JMX_RETURN_IF_ERROR(Want(t[2].cols == lp * h, "out must be (B*N, Lp*H), Lp = L rounded up to 128"));
  JMX_RETURN_IF_ERROR(Want(b <= 65535 && n <= 65535, "grid too large (B and N must be <= 65535)"));
  return Launch(entry, device, t, 3, stream);
}

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_realign, jmx::AttentionRealignImpl,
                              (jmx::BindBuffers<2, 1>()
                                  .Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_realign);

#pragma GCC visibility pop
