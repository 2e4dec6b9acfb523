"""Geometry both Blackwell attention kernels share (forward kernels/sm100/attention_fwd.py, backward
kernels/sm100/attention_bwd.py and its pre-pass): the compile target, the tile and scale-chunk sizes and the
per-SM limits. Pure Python (no DSL): the configs, the shared device blocks (tile_scheduler.py,
attention_loads.py, attention_mask.py) and the host-side tables (primitives/attention_sm100_packed.py) import
it.
"""

from __future__ import annotations

ARCH = "sm_100f"
"""One cubin for cc 10.0 (B200, GB200) and 10.3 (B300, GB300): the family target (docs/perf/blackwell.md)."""
TILE = 128
"""Rows of a Q tile, keys of a KV tile (one TMEM lane each: the 1-CTA block-scaled MMA's M) and rows of one
128x4 scale chunk; packed sequences start their tiles and chunks at their first row."""
BLOCK = 32
"""Elements per MX block (one E8M0 byte), the block-scaled MMA's K per instruction."""
SCALE_CHUNK = 512
"""Bytes of one 128x4 blocked scale chunk (128 MN rows x 4 K blocks of 32; formats/blocked_scales.py)."""
HEAD_DIMS = (64, 128)
WARPS = 16
THREADS = 32 * WARPS
"""Both kernels run 16 warps (512 threads) per CTA, one CTA per SM."""
REGISTER_FILE = 65536
SMEM_LIMIT = 227 * 1024
