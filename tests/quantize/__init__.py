"""Formats, quantize / dequantize, rounding, MXArray, float32 range, blocked scales and the quantize kernels."""
