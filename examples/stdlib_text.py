"""A real-text corpus every machine has without a download: the Python standard library's own source.

The files are the `*.py` files under `sysconfig.get_paths()["stdlib"]` (site-packages and __pycache__
left out), in sorted order. The held-out split takes whole files: a file is held out when the CRC-32 of its
path relative to the stdlib root is 0 modulo `holdout_every` (default 20, about 5% of the files), so the
split is the same on every machine with the same Python version and no validation text leaks into
training. Tokens are bytes (vocabulary 256, a multiple of 32 as the MX blocks want); files are joined with
a NUL byte, which Python source does not contain.
"""

from __future__ import annotations

import dataclasses
import sys
import sysconfig
import zlib
from pathlib import Path

import numpy as np

SEPARATOR = b"\x00"


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Byte streams (uint8) of the training and held-out files, and where they came from."""

    train: np.ndarray
    val: np.ndarray
    train_files: int
    val_files: int
    root: str
    python: str

    def describe(self) -> str:
        return (
            f"Python {self.python} stdlib source ({self.root}): {self.train_files} files / "
            f"{len(self.train) / 1e6:.1f} MB train, {self.val_files} files / {len(self.val) / 1e6:.2f} MB held out"
        )


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Every .py file of the standard library, sorted; ValueError when there are none."""
    root = root or stdlib_root()
    files = sorted(
        p for p in root.rglob("*.py") if p.is_file() and not ({"site-packages", "__pycache__"} & set(p.parts))
    )
    if not files:
        raise ValueError(f"no .py files under {root} (sysconfig's stdlib path)")
    return files


def is_held_out(relative: str, holdout_every: int = 20) -> bool:
    """Whether the file at this stdlib-relative POSIX path belongs to the held-out split."""
    return zlib.crc32(relative.encode()) % holdout_every == 0


def load_corpus(root: Path | None = None, holdout_every: int = 20, max_train_bytes: int | None = None) -> Corpus:
    """The stdlib corpus split into whole files; `max_train_bytes` keeps the first files up to that size."""
    root = root or stdlib_root()
    train, val = [], []
    size = 0
    for path in stdlib_files(root):
        rel = path.relative_to(root).as_posix()
        if is_held_out(rel, holdout_every):
            val.append(path.read_bytes())
        elif max_train_bytes is None or size < max_train_bytes:
            data = path.read_bytes()
            train.append(data)
            size += len(data) + 1
    if not train or not val:
        raise ValueError(f"the stdlib under {root} has too few files for a split ({len(train)} / {len(val)})")
    return Corpus(
        train=np.frombuffer(SEPARATOR.join(train), np.uint8),
        val=np.frombuffer(SEPARATOR.join(val), np.uint8),
        train_files=len(train),
        val_files=len(val),
        root=str(root),
        python=".".join(map(str, sys.version_info[:3])),
    )


class ByteTokenizer:
    """Byte-level tokens: vocabulary 256 (bytes 0-255)."""

    vocab_size = 256

    def encode(self, s: str) -> np.ndarray:
        return np.frombuffer(s.encode(), np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
