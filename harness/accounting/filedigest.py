"""File digests of a checkpoint, each byte hashed once (digest format 2). Torch-free.

A file is cut into ranges by its format, read from the file itself:

    *.safetensors   the 8-byte length and JSON header, then each tensor's bytes (in file order)
    a zip file      (what torch.save writes: optimizer.pt, scheduler.pt, rng_state.pth) each stored entry's bytes,
                    and the zip's own records between them (local headers, alignment padding, central directory)
    anything else   one range, the whole file

The file's digest is xxh3-128 over, for every range in file order, its length and the xxh3-128 of its bytes.
Every byte of the file lies in exactly one range, so any change to any byte changes the digest (short of a
collision, which xxh3-128 makes negligible for accidents: it is not a defence against a forger; see
docs/run-dir.md). Verify recomputes it from the file alone, the ranges found the same way.

At save time, the ranges that hold the bytes of tensors the trainer wrote from memory need not be read back: their
digest is the digest of those bytes in memory, taken once for the state digests the resume audit compares
(`known` below; harness.accounting.tensorfiles supplies it). Everything else is read from the file, once.

Checkpoints of digest format 1 (before this module) recorded sha256 of whole files; they still verify
(harness.accounting.checkpoint).
"""

from __future__ import annotations

import json
import mmap
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import xxhash

FORMAT = 2  # the manifest's "digests"; absent: 1 (sha256 of whole files, sha256 state digests)
ALGORITHM = "xxh3"  # the key of a file's digest in the manifest (format 1: "sha256")
SMALL = 1 << 16  # files below this are one range: cutting them saves nothing


@dataclass(frozen=True)
class Range:
    start: int
    end: int
    name: str | None = None  # "tensor:<key>" (safetensors), "entry:<name>" (zip); None: the format's own bytes


def _safetensors_ranges(mv: memoryview) -> list[Range]:
    (n,) = struct.unpack_from("<Q", mv, 0)
    header = json.loads(bytes(mv[8:8 + n]))
    base = 8 + n
    spans = sorted((base + m["data_offsets"][0], base + m["data_offsets"][1], k)
                   for k, m in header.items() if k != "__metadata__")
    return _with_gaps([Range(0, base)] + [Range(b, e, f"tensor:{k}") for b, e, k in spans], len(mv))


def _zip_ranges(path: Path, mv: memoryview) -> list[Range]:
    spans = []
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError("a compressed entry")
            off = info.header_offset
            if bytes(mv[off:off + 4]) != b"PK\x03\x04":
                raise ValueError("no local header")
            name_len, extra_len = struct.unpack_from("<HH", mv, off + 26)
            start = off + 30 + name_len + extra_len
            spans.append(Range(start, start + info.compress_size, f"entry:{info.filename}"))
    return _with_gaps(sorted(spans, key=lambda r: r.start), len(mv))


def _with_gaps(spans: list[Range], size: int) -> list[Range]:
    """The spans with the bytes between them as unnamed ranges: a partition of [0, size), or ValueError."""
    out, at = [], 0
    for r in spans:
        if r.start < at or r.end < r.start or r.end > size:
            raise ValueError("overlapping or out-of-file ranges")
        if r.start > at:
            out.append(Range(at, r.start))
        if r.end > r.start or r.name:
            out.append(r)
        at = r.end
    if at < size:
        out.append(Range(at, size))
    return out


def ranges(path: Path, mv: memoryview) -> list[Range]:
    """How the file is cut: by its format when it parses as one, else one range. A function of the bytes (and the
    name) alone, so that save and verify cut an intact file alike."""
    size = len(mv)
    try:
        if size >= SMALL and path.name.endswith(".safetensors"):
            return _safetensors_ranges(mv)
        if size >= SMALL and bytes(mv[:4]) == b"PK\x03\x04":
            return _zip_ranges(path, mv)
    except (ValueError, KeyError, TypeError, struct.error, zipfile.BadZipFile, UnicodeDecodeError):
        pass  # not the format it looks like (or damaged): hashed as one range, which then differs
    return [Range(0, size)]


def safetensors_keys(path: str | Path) -> set[str]:
    """The tensor names of a safetensors file, from its header alone; ValueError when it has none."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: too short for safetensors")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise ValueError(f"{path}: a header of {n} bytes is not safetensors")
        return {k for k in json.loads(fh.read(n)) if k != "__metadata__"}


Known = Callable[[Range], "bytes | None"]  # a range's digest from memory, or None: read it from the file


def file_digest(path: str | Path, known: Known | None = None) -> str:
    path = Path(path)
    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        if size == 0:
            return h.hexdigest()
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            mv = memoryview(mm)
            try:
                for r in ranges(path, mv):
                    d = known(r) if known is not None and r.name else None
                    h.update(struct.pack("<Q", r.end - r.start))
                    h.update(d if d is not None else xxhash.xxh3_128(mv[r.start:r.end]).digest())
            finally:
                mv.release()
    return h.hexdigest()


# --- a torch.save zip's structure, read without torch: which stored entry holds which tensor of the saved object


@dataclass(frozen=True)
class StorageRef:
    key: str  # the entry <archive>/data/<key>
    dtype: str  # e.g. "FloatStorage"
    numel: int


@dataclass(frozen=True)
class TensorRef:
    storage: StorageRef
    offset: int
    shape: tuple
    stride: tuple


class _Opaque:
    """Anything else the pickle names (a class, a dtype): kept as its name, called or not."""

    def __init__(self, name: str, *args):
        self.name, self.args = name, args

    def __call__(self, *args, **kwargs):
        return _Opaque(self.name, *args)

    def __setstate__(self, state):
        self.state = state


def _rebuild_tensor(storage, offset, shape, stride, *rest):
    return TensorRef(storage, offset, tuple(shape), tuple(stride))


class _TorchFreeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in (("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor")):
            return _rebuild_tensor
        if (module, name) == ("collections", "OrderedDict"):
            import collections

            return collections.OrderedDict
        if module == "builtins" and name in ("set", "frozenset", "slice", "complex", "range"):
            import builtins

            return getattr(builtins, name)
        return _Opaque(f"{module}.{name}")

    def persistent_load(self, pid):
        kind, storage_type, key, _location, numel = pid
        if kind != "storage":
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        return StorageRef(str(key), getattr(storage_type, "name", str(storage_type)).rsplit(".", 1)[-1], int(numel))


def torch_zip_structure(path: str | Path):
    """(the saved object with each tensor as a TensorRef, the archive's name prefix) of a torch.save zip file;
    ValueError when it is not one."""
    import io

    try:
        with zipfile.ZipFile(path) as zf:
            pkl = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pkl) != 1:
                raise ValueError(f"{path}: no single data.pkl")
            return _TorchFreeUnpickler(io.BytesIO(zf.read(pkl[0]))).load(), pkl[0].split("/")[0]
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError) as exc:
        raise ValueError(f"{path}: not a torch.save zip ({exc})") from exc
