"""Layer 5: FFI-backed ops (abstract eval, sharding, batching, reference fallback)."""
