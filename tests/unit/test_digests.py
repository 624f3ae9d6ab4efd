"""Checkpoint digests (issue 47): each byte of a checkpoint hashed once, and every change still caught.

- a file's digest is the same whether its tensor ranges come from memory (the Recorder, as the Trainer writes)
  or from the file (verify): safetensors weights and a torch.save optimizer state;
- one checkpoint hashes each byte once: the bytes fed to xxh3 add up to the checkpoint's size, not twice it;
- a flipped byte anywhere (a header, a tensor, the zip's own records, a small file) changes the digest;
- format 1 (sha256, before) still verifies; no digest path copies state with .tobytes().
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import xxhash

from harness.accounting import checkpoint as ckpt
from harness.accounting import filedigest, statedigest, tensorfiles
from harness.accounting.filedigest import file_digest, ranges


def _model_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(96, 128), torch.nn.Linear(128, 64, bias=False))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return model, opt


def _save(ckpt_dir: Path, model, opt) -> None:
    """What the Trainer writes: the weights with safetensors' save_file, the optimizer state with torch.save."""
    from safetensors.torch import save_file

    ckpt_dir.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt_dir / "model.safetensors"))
    torch.save(opt.state_dict(), ckpt_dir / "optimizer.pt")
    (ckpt_dir / "trainer_state.json").write_text(json.dumps({"global_step": 2}))


class _Counting:
    """xxh3_128 that adds up the bytes it is given, installed in every digest module."""

    def __init__(self, monkeypatch):
        self.bytes = 0
        real = xxhash.xxh3_128
        counter = self

        class Hasher:
            def __init__(self, data=b""):
                self.h = real()
                self.update(data)

            def update(self, data):
                counter.bytes += memoryview(data).nbytes
                self.h.update(data)

            def digest(self):
                return self.h.digest()

            def hexdigest(self):
                return self.h.hexdigest()

        for mod in (filedigest, statedigest, tensorfiles):
            monkeypatch.setattr(mod.xxhash, "xxh3_128", Hasher)


def test_memory_digests_equal_the_files_and_each_byte_is_hashed_once(tmp_path, monkeypatch):
    model, opt = _model_and_optimizer()
    counting = _Counting(monkeypatch)
    root = tmp_path / "checkpoints"
    with tensorfiles.recording(root) as rec:
        _save(root / "checkpoint-2", model, opt)
        state = statedigest.state_digests(model, opt, None, memo=rec.memo)
        files = rec.checkpoint_files(root / "checkpoint-2", {"optimizer.pt": statedigest.optimizer_state(opt)})
    on_disk = sum(p.stat().st_size for p in (root / "checkpoint-2").iterdir())
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3  # weights, exp_avg, exp_avg_sq
    assert state_bytes > 0.9 * on_disk  # (the check below means something: the state is most of the checkpoint)
    # every byte once, plus the small things hashed whole (RNG states of python and numpy, the digests themselves)
    assert counting.bytes < on_disk + 64 * 1024, (counting.bytes, on_disk)
    # what the Recorder took from memory is what verify reads from the files
    assert files == ckpt.file_digests(root / "checkpoint-2")
    assert state == statedigest.state_digests(model, opt, None)  # the memo changes no digest


def test_without_a_memo_the_checkpoint_is_hashed_twice(tmp_path, monkeypatch):
    """The counter above can fail: digesting the state and then the files from disk reads every byte twice."""
    model, opt = _model_and_optimizer()
    counting = _Counting(monkeypatch)
    _save(tmp_path / "checkpoint-2", model, opt)
    statedigest.state_digests(model, opt, None)
    ckpt.file_digests(tmp_path / "checkpoint-2")
    assert counting.bytes > 1.8 * sum(p.stat().st_size for p in (tmp_path / "checkpoint-2").iterdir())


def test_files_are_cut_by_their_format_into_a_partition(tmp_path):
    model, opt = _model_and_optimizer()
    _save(tmp_path / "c", model, opt)
    for name, kind in (("model.safetensors", "tensor:"), ("optimizer.pt", "entry:")):
        p = tmp_path / "c" / name
        data = p.read_bytes()
        cut = ranges(p, memoryview(data))
        assert cut[0].start == 0 and cut[-1].end == len(data)
        assert all(a.end == b.start for a, b in zip(cut, cut[1:]))
        assert sum(1 for r in cut if (r.name or "").startswith(kind)) >= 3
    small = tmp_path / "c" / "trainer_state.json"
    assert len(ranges(small, memoryview(small.read_bytes()))) == 1


@pytest.mark.parametrize("name, where", [
    ("model.safetensors", "header"), ("model.safetensors", "tensor"),
    ("optimizer.pt", "entry"), ("optimizer.pt", "zip records"), ("optimizer.pt", "last byte"),
    ("trainer_state.json", "last byte"),
])
def test_a_flipped_byte_anywhere_changes_the_digest(tmp_path, name, where):
    model, opt = _model_and_optimizer()
    _save(tmp_path / "c", model, opt)
    p = tmp_path / "c" / name
    data = bytearray(p.read_bytes())
    cut = ranges(p, memoryview(bytes(data)))
    before = file_digest(p)
    if where == "header":
        at = 20  # inside the JSON header
    elif where in ("tensor", "entry"):
        r = max((r for r in cut if r.name), key=lambda r: r.end - r.start)
        at = (r.start + r.end) // 2
    elif where == "zip records":
        at = next(r for r in cut if r.name is None and r.start > 0).start + 1
    else:
        at = len(data) - 1
    data[at] ^= 0x01
    p.write_bytes(bytes(data))
    assert file_digest(p) != before


def test_a_checkpoint_of_format_1_still_verifies_and_its_tampering_is_caught(tmp_path):
    """Run dirs written before format 2 recorded sha256 of whole files and no "digests": they verify as they did."""
    from harness.identity import sha256_file

    model, opt = _model_and_optimizer()
    d = tmp_path / "checkpoints" / "checkpoint-2"
    _save(d, model, opt)
    ckpt.publish(d, step=2, identity={}, frontier={}, state={}, totals={}, permanent=False)
    manifest = json.loads((d / ckpt.CHECKPOINT_MANIFEST).read_text())
    assert manifest["digests"] == 2 and all("xxh3" in m for m in manifest["files"].values())
    assert ckpt.checkpoint_problems(d) == []
    old = {**{k: v for k, v in manifest.items() if k != "digests"},
           "files": {rel: {"sha256": sha256_file(d / rel), "size": m["size"]} for rel, m in manifest["files"].items()}}
    (d / ckpt.CHECKPOINT_MANIFEST).write_text(json.dumps(old))
    assert ckpt.checkpoint_problems(d) == []
    data = bytearray((d / "optimizer.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (d / "optimizer.pt").write_bytes(bytes(data))
    assert ckpt.checkpoint_problems(d) == ["checkpoint-2/optimizer.pt: sha256 differs from the recorded digest"]


def test_state_digests_of_format_1_are_the_sha256_ones_recorded_before(tmp_path):
    """A resume from a format-1 checkpoint is audited in format 1: the same values the old code recorded."""
    import hashlib

    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    want = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode() + t.numpy().tobytes()).hexdigest()
    assert statedigest.digest(t, 1) == want
    assert statedigest.digest(t, 2) != want


def test_no_digest_path_copies_state_with_tobytes():
    for mod in (filedigest, statedigest, tensorfiles):
        assert ".tobytes(" not in Path(mod.__file__).read_text(), mod.__name__


def test_the_weights_are_digested_as_written(tmp_path):
    """The weights' digests are taken from the memory safetensors writes, at the write: a parameter changed
    afterwards does not change what the manifest records for the file (verify reads the file itself)."""
    model, opt = _model_and_optimizer()
    root = tmp_path / "checkpoints"
    with tensorfiles.recording(root) as rec:
        _save(root / "checkpoint-2", model, opt)
        with torch.no_grad():
            next(model.parameters()).add_(1.0)  # after the write: the recorded digests describe the file, not this
        files = rec.checkpoint_files(root / "checkpoint-2")
    assert files == ckpt.file_digests(root / "checkpoint-2")
