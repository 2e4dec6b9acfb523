// The generated kernel table: one launch adapter per (variant, arch), see tools/build_kernels.py.
#include "common.h"

// The DSL's exported headers include <cuda_fp16.h> but use no half types; that header needs CCCL's
// <nv/target>, which the nvidia-cuda-runtime wheel does not ship. Mark it as already included.
#define __CUDA_FP16_H__

#include "kernels_table.inc"
