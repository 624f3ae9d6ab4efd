"""A checkpoint's tensor files, digested from memory: each byte of a checkpoint hashed once. Imports torch.

The Trainer writes a checkpoint's weights from the model's memory (safetensors) and its optimizer state from the
optimizer's (torch.save). The resume audit needs digests of that memory (harness.accounting.statedigest); the
verify needs digests of the files (harness.accounting.filedigest). Hashing both would read every byte twice. A
`Recorder` takes the digest of each tensor once and hands it to both:

- the weights: safetensors' writer is handed every tensor's data pointer and length; the recorder hashes that
  memory as it is written and keeps the digest under the file and tensor name (the file's tensor ranges), and
  under the memory's address (the state digests of the same parameters then find it in the memo);
- the optimizer state: its tensors are hashed in memory for the state digests; the recorder finds which entry
  of optimizer.pt holds which of them from the zip's pickle (read without torch: filedigest.torch_zip_structure)
  and lends the entry its tensor's digest when the tensor is exactly the entry's bytes.

Whatever it cannot match exactly (a tensor converted before writing, a sharded optimizer, a file another way
wrote) is read from the file, as verify does: the memo only saves time, it never decides a digest.

NOTE(safetensors-0.8): the weights are seen by wrapping `safetensors.torch.serialize_file`, the one call every
`safetensors.torch.save_file` makes (transformers, the Trainer and PEFT import save_file under their own names);
tests/unit/test_trl_contract.py pins its signature and the TensorSpec fields read here.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import Any, Callable

import torch
import xxhash

from harness.accounting.filedigest import Known, Range, TensorRef, file_digest, torch_zip_structure
from harness.accounting.statedigest import Memo, tensor_digest

_CHECKPOINT = re.compile(r"checkpoint-\d+$")
_RECORDERS: dict[Path, "Recorder"] = {}
_original_serialize = None


class Recorder:
    """The digests taken in one checkpoint of the Trainer output_dir `root` (cleared by `forget` once published)."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.memo: Memo = {}
        self.written: dict[Path, dict[str, tuple[int, bytes]]] = {}  # file -> {tensor: (bytes, digest)}
        self.digests: dict[Path, tuple[int, int, str]] = {}  # file -> (size, mtime_ns, digest): asked twice, hashed once

    def saw(self, filename: Path, specs: dict) -> None:
        tensors = {}
        for key, spec in specs.items():
            n, ptr = int(spec.data_len), int(spec.data_ptr)
            d = xxhash.xxh3_128((ctypes.c_char * n).from_address(ptr) if n else b"").digest()
            tensors[key] = (n, d)
            self.memo[("cpu", ptr, n)] = d  # a CPU tensor is written from its own memory
        self.written[filename] = tensors

    def file_digest(self, path: Path, saved: Any = None) -> str:
        """The format-2 digest of one file of the checkpoint; `saved`: the object torch.save wrote to it, if known."""
        path = Path(path).resolve()
        st = path.stat()
        hit = self.digests.get(path)
        if hit and hit[:2] == (st.st_size, st.st_mtime_ns):
            return hit[2]
        d = file_digest(path, self._known(path, saved))
        self.digests[path] = (st.st_size, st.st_mtime_ns, d)
        return d

    def _known(self, path: Path, saved: Any):
        if path in self.written:
            tensors = self.written[path]

            def from_write(r: Range) -> bytes | None:
                got = tensors.get(r.name[len("tensor:"):]) if r.name.startswith("tensor:") else None
                return got[1] if got and got[0] == r.end - r.start else None

            return from_write
        return None if saved is None else _saved_known(path, saved, self.memo)

    def checkpoint_files(self, ckpt_dir: Path, saved: dict[str, Any] | None = None) -> dict[str, dict]:
        """What publish records of every file of the checkpoint (checkpoint.file_digests), with this recorder's
        digests; `saved`: {file name: the object torch.save wrote to it}."""
        from harness.accounting.checkpoint import file_digests

        saved = saved or {}
        return file_digests(Path(ckpt_dir), lambda p: self.file_digest(p, saved.get(p.name)))

    def forget(self) -> None:
        """After the checkpoint is published: the next step changes the memory these digests describe."""
        self.memo.clear()
        self.written.clear()
        self.digests.clear()

    def close(self) -> None:
        if _RECORDERS.get(self.root) is self:
            del _RECORDERS[self.root]


def _whole(t: torch.Tensor, r: Range) -> bool:
    """The tensor's memory is exactly the range's bytes (contiguous, all of them)."""
    return t.is_contiguous() and t.numel() * t.element_size() == r.end - r.start


def _saved_known(path: Path, saved: Any, memo: Memo) -> Known | None:
    """The digests of a torch.save zip's entries from the object it holds in memory (`saved`): an entry whose
    storage is exactly one tensor's bytes has that tensor's digest; the others (None) are read from the file."""
    try:
        structure, archive = torch_zip_structure(path)
    except ValueError:
        return None
    pairs: dict[str, tuple[torch.Tensor, TensorRef]] = {}
    _pair(saved, structure, pairs)
    entries = {f"entry:{archive}/data/{key}": pair for key, pair in pairs.items()}

    def from_memory(r: Range) -> bytes | None:
        pair = entries.get(r.name)
        if pair is None:
            return None
        t, ref = pair
        whole = (_whole(t, r) and t.storage_offset() == 0 and ref.offset == 0 and ref.shape == tuple(t.shape)
                 and t.untyped_storage().nbytes() == r.end - r.start)
        return tensor_digest(t, memo) if whole else None

    return from_memory


def _named_known(tensors: dict[str, torch.Tensor], memo: Memo) -> Known:
    """The digests of a safetensors file's tensor ranges from the tensors of the same names in memory."""

    def from_memory(r: Range) -> bytes | None:
        t = tensors.get(r.name[len("tensor:"):]) if r.name.startswith("tensor:") else None
        return tensor_digest(t, memo) if t is not None and _whole(t, r) else None

    return from_memory


def _disk_names(model) -> dict[str, torch.Tensor]:
    """The model's tensors under the names its checkpoint's safetensors files use: save_pretrained reverts the
    weight conversions of transformers' loading (Qwen-VL's model.language_model.* is model.* on disk).
    NOTE(transformers-5.24): the same private function save_pretrained calls; tests/unit/test_trl_contract.py pins
    it. Where it fails, the state_dict's own names (a name not found is read from the file)."""
    state = model.state_dict()
    try:
        from transformers.core_model_loading import revert_weight_conversion

        return revert_weight_conversion(model, dict(state))
    except Exception:  # noqa: BLE001 (only a saving of time is lost)
        return state


def loaded_state(model, optimizer, memo: Memo) -> Callable[[Path], Known | None]:
    """What a resumed process loaded from a checkpoint, as the digests of the checkpoint files' tensor ranges (for
    the resume's deep check, ResumePoint.confirm): the weights' files (model*.safetensors) from the model's tensors
    of the same names, optimizer.pt from the optimizer's state. Each range's digest is that of the tensor in memory
    (the resume audit's memo: hashed once for both). A file whose digest then equals the recorded one held, where
    the Trainer read it, the bytes now in memory, and was intact everywhere else (those ranges are read from the
    file); where it differs, the caller reads the whole file to tell a damaged file from a load that went wrong."""
    from harness.accounting.statedigest import optimizer_state

    named: dict[str, torch.Tensor] = {}

    def known(path: Path) -> Known | None:
        name = Path(path).name
        if name.startswith("model") and name.endswith(".safetensors") and model is not None:
            if not named:
                named.update(_disk_names(model))
            return _named_known(named, memo)
        if name == "optimizer.pt" and optimizer is not None:
            return _saved_known(Path(path), optimizer_state(optimizer), memo)
        return None

    return known


def _pair(mem: Any, ref: Any, out: dict) -> None:
    """Walk the object in memory and its pickled structure together: each storage key's first tensor."""
    if isinstance(ref, TensorRef):
        if isinstance(mem, torch.Tensor):
            out.setdefault(ref.storage.key, (mem, ref))
    elif isinstance(ref, dict) and isinstance(mem, dict):
        for k, v in ref.items():
            if k in mem:
                _pair(mem[k], v, out)
    elif isinstance(ref, (list, tuple)) and isinstance(mem, (list, tuple)) and len(ref) == len(mem):
        for a, b in zip(mem, ref):
            _pair(a, b, out)


def _serialize_file(tensor_dict, filename, metadata=None):
    path = Path(filename).resolve()
    for root, rec in list(_RECORDERS.items()):
        if path.is_relative_to(root) and len(rel := path.relative_to(root).parts) > 1 and _CHECKPOINT.match(rel[0]):
            rec.saw(path, tensor_dict)
            break
    return _original_serialize(tensor_dict, filename, metadata=metadata)


def start(root: str | Path) -> Recorder:
    """Record the checkpoints the Trainer writes under `root` (its output_dir) from now on."""
    global _original_serialize
    import safetensors.torch as st

    if _original_serialize is None:
        _original_serialize = st.serialize_file
        st.serialize_file = _serialize_file
    rec = Recorder(root)
    _RECORDERS[rec.root] = rec
    return rec


def recorder_for(root: str | Path) -> Recorder | None:
    return _RECORDERS.get(Path(root).resolve())


class recording:
    """`with recording(output_dir) as rec:` around a Trainer's saves (bench/checkpoint.py; the train stage uses
    start/close through CheckpointCallback)."""

    def __init__(self, root: str | Path):
        self.root = root

    def __enter__(self) -> Recorder:
        self.rec = start(self.root)
        return self.rec

    def __exit__(self, *exc) -> None:
        self.rec.close()
