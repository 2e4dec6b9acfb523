// XLA FFI handler for the Blackwell attention operand producer (jax_mxfp8/kernels/sm100/attention_operands.py,
// registry op "attention_operands_sm100", cubins for sm_100f: compute capability 10.0 and 10.3). NOT RUN ON
// HARDWARE by this project.
//
//   jax_mxfp8_attention_operands_sm100       (x) -> (data, sq, hd, seq)
//   jax_mxfp8_attention_operands_sm100_into  (x, data, sq, hd, seq) -> (data, sq, hd, seq): the results passed
//                                            in as well (aliased), the NaN-poisoning test hook
//   attribute: kernel (string) = the registry variant name, e.g. "attention_operands_sm100_h128_bf16_e4m3_up";
//   the variant fixes the input dtype, head_dim H and the scale rounding.
//
// Buffers (docs/interfaces.md "sm100 attention"; Lc = ceil(L / 128)):
//   x     (B, L, heads, H) bf16 / f32, L a multiple of 32, H the variant's head_dim
//   data  (B, L, heads, H) f8e4m3fn      square-block MX data (x's layout)
//   sq    (B, L / 32, heads, H / 32) u8  the square E8M0 scales
//   hd    (B, heads, Lc, 1, 512) u8      orientation "hd" in the tcgen05 128x4 layout
//   seq   (B, heads, 1, Lc, 512) u8      orientation "seq"
// The kernel takes 2-D row-major views: x and data (B L, heads H), sq (B L/32, heads H/32), hd and seq
// (B heads, Lc 512). Every failure is an ffi::Error naming the op and the variant; the handler only enqueues the
// kernel on XLA's stream (CUDA-graph compatible). B, L or heads = 0: nothing to do.
#include <initializer_list>
#include <string>
#include <string_view>

#include "common.h"

namespace jmx {
namespace {

constexpr std::string_view kOp = "attention_operands_sm100";  // registry AttentionOperandsSm100Config.op
constexpr int64_t kChunkBytes = 512;
constexpr int64_t kInt32Max = 2147483647;

std::string ShapeOf(ffi::AnyBuffer::Dimensions d) {
  std::string out = "(";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + ")";
}

std::string ShapeOf(std::initializer_list<int64_t> d) {
  std::string out = "(";
  int i = 0;
  for (int64_t x : d) out += (i++ ? ", " : "") + std::to_string(x);
  return out + ")";
}

// Checks dtype and exact shape; the 2-D view with the first `split` axes as rows.
ffi::Error View(std::string_view kernel, void* data, ffi::AnyBuffer::Dimensions dims, ffi::DataType got,
                ffi::DataType want, const char* what, std::initializer_list<int64_t> shape, size_t split,
                TensorView* out) {
  const std::string head = "kernel '" + std::string(kernel) + "': ";
  bool same = dims.size() == shape.size();
  size_t i = 0;
  for (int64_t d : shape) same = same && dims[i++] == d;
  JMX_RETURN_IF_ERROR(Want(same, kOp, head + what + " is " + ShapeOf(dims) + ", expected " + ShapeOf(shape)));
  JMX_RETURN_IF_ERROR(Want(got == want, kOp, head + what + " has dtype " + DTypeName(got) + ", expected " +
                                                DTypeName(want)));
  int64_t rows = 1, cols = 1;
  for (size_t a = 0; a < dims.size(); ++a) (a < split ? rows : cols) *= dims[a];
  JMX_RETURN_IF_ERROR(Want(rows <= kInt32Max && cols <= kInt32Max && rows * cols <= kInt32Max, kOp,
                           head + what + " is too large for the kernel (32-bit sizes)"));
  JMX_RETURN_IF_ERROR(Want(reinterpret_cast<uintptr_t>(data) % 16 == 0, kOp, head + what + " must be 16-byte aligned"));
  *out = TensorView{data, static_cast<int32_t>(rows), static_cast<int32_t>(cols)};
  return ffi::Error::Success();
}

ffi::Error Run(cudaStream_t stream, int32_t device, std::string_view kernel, const ffi::AnyBuffer& x,
               ffi::RemainingRets& rets) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOp, kernel, &entry));
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "in_dtype", x.element_type(), "x"));
  const auto xd = x.dimensions();
  JMX_RETURN_IF_ERROR(Want(xd.size() == 4, kOp, "x must be (B, L, heads, H), got " + ShapeOf(xd)));
  const int64_t b = xd[0], l = xd[1], heads = xd[2], h = xd[3], lc = (l + 127) / 128;
  const int64_t head_dim = Param(entry, "head_dim");
  JMX_RETURN_IF_ERROR(Want(h == head_dim, kOp, "kernel '" + std::string(entry->name) + "' has head_dim " +
                                                   std::to_string(head_dim) + ", x has H = " + std::to_string(h)));
  JMX_RETURN_IF_ERROR(Want(l % 32 == 0, kOp, "L = " + std::to_string(l) + " must be a multiple of 32 (square blocks)"));
  ffi::Result<ffi::AnyBuffer> out[4] = {*rets.get<ffi::AnyBuffer>(0), *rets.get<ffi::AnyBuffer>(1),
                                        *rets.get<ffi::AnyBuffer>(2), *rets.get<ffi::AnyBuffer>(3)};
  TensorView t[5];
  const ffi::DataType u8 = ffi::DataType::U8;
  JMX_RETURN_IF_ERROR(View(entry->name, x.untyped_data(), xd, x.element_type(), x.element_type(), "x",
                           {b, l, heads, h}, 2, &t[0]));
  JMX_RETURN_IF_ERROR(View(entry->name, out[0]->untyped_data(), out[0]->dimensions(), out[0]->element_type(),
                           ffi::DataType::F8E4M3FN, "data", {b, l, heads, h}, 2, &t[1]));
  JMX_RETURN_IF_ERROR(View(entry->name, out[1]->untyped_data(), out[1]->dimensions(), out[1]->element_type(), u8,
                           "sq", {b, l / 32, heads, h / 32}, 2, &t[2]));
  JMX_RETURN_IF_ERROR(View(entry->name, out[2]->untyped_data(), out[2]->dimensions(), out[2]->element_type(), u8,
                           "hd", {b, heads, lc, 1, kChunkBytes}, 2, &t[3]));
  JMX_RETURN_IF_ERROR(View(entry->name, out[3]->untyped_data(), out[3]->dimensions(), out[3]->element_type(), u8,
                           "seq", {b, heads, 1, lc, kChunkBytes}, 2, &t[4]));
  if (b == 0 || l == 0 || heads == 0) return ffi::Error::Success();
  return Launch(entry, device, t, 5, stream);
}

template <bool kInto>
ffi::Error Handle(cudaStream_t stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets,
                  std::string_view kernel) {
  if (args.size() != (kInto ? 5u : 1u) || rets.size() != 4) {
    return Want(false, kOp, "the target takes " + std::to_string(kInto ? 5 : 1) + " operands and 4 results, got " +
                                std::to_string(args.size()) + " and " + std::to_string(rets.size()));
  }
  for (size_t i = 0; i < 4; ++i) {
    auto r = rets.get<ffi::AnyBuffer>(i);
    if (r.has_error()) return r.error();
  }
  auto x = args.get<ffi::AnyBuffer>(0);
  if (x.has_error()) return x.error();
  return Run(stream, device, kernel, *x, rets);
}

auto Binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Ctx<ffi::DeviceOrdinal>()
      .RemainingArgs()
      .RemainingRets()
      .Attr<std::string_view>("kernel");
}

constexpr auto kTarget = &Handle<false>;
constexpr auto kInto = &Handle<true>;

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_operands_sm100, jmx::kTarget, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_operands_sm100);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_operands_sm100_into, jmx::kInto, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_operands_sm100_into);

#pragma GCC visibility pop
