"""rms_norm_quantize: the reference and the fused RMSNorm + quantize kernel."""
