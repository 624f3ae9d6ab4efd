"""`python -m harness.verify` catches tampering: each check fires on a run dir broken in its way.

A real run directory (GRPO with its SFT warm start, one rank; GRPO on two ranks) verifies to []; a copy of
it tampered in one way verifies to exactly the violations that tampering must cause, in order. So no check
is a no-op, and none fires on an intact run. What the frontier check covers and what it cannot (an edit
before the oldest retained checkpoint's segment) is stated by its own cases.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Callable

import pytest

from harness.accounting.logs import read_rows
from harness.accounting.checkpoint import CHECKPOINT_MANIFEST, complete_checkpoints
from harness.verify import verify
from tests.conftest import run_harness

LEDGER0, LEDGER1, TRACE0 = "ledgers/rank-0.jsonl", "ledgers/rank-1.jsonl", "traces/rank-0.jsonl"
METRICS = "metrics.jsonl"
EDITED = "(edited after it was bound?); fix: restore the original"


class Starts(str):
    """An expected violation given by its beginning (the rest is the fix hint)."""


def matches(got: list[str], expected: list[str]) -> bool:
    return len(got) == len(expected) and all(
        g.startswith(e) if isinstance(e, Starts) else g == e for g, e in zip(got, expected))


def assert_violations(run: Path, expected: list[str]) -> None:
    got = verify(run)
    assert matches(got, expected), "verify(copy) returned\n  " + "\n  ".join(got) + "\nexpected\n  " + \
        "\n  ".join(expected)


# --- the real runs (made once per module)


def _run_dir(out: Path, arm: str) -> Path:
    (d,) = [p for p in (out / "runs").iterdir() if p.name.startswith(arm + "-")]
    return d


# One intra-op thread per process, as the multi-process launcher gives each rank: on a 2-core machine shared
# with other jobs, torch's default of one thread per core oversubscribes it (measured here: the one-rank
# fixture took 230 s with the default, 36 s with one thread, under the same load). Threads are not part of
# a run's identity.
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> list[str]:
    """Shared data and model caches (not part of a run's identity): built by the first run only."""
    root = tmp_path_factory.mktemp("cache")
    return [f"data.cache_dir={root / 'data'}", f"model.cache_dir={root / 'models'}"]


@pytest.fixture(scope="module")
def one_rank(tiny) -> dict[str, Path]:
    """The session's debug=tiny pipeline (tests/conftest.py): every test tampers with a copy of it."""
    return {"grpo": tiny.grpo, "sft": tiny.sft}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, cache) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("two_ranks")
    proc = run_harness("arm=grpo", "placement=ddp", "placement.num_processes=2", "debug=tiny",
                       "train.eval_before=false", "train.eval_after=false", f"output_root={out}", *cache, timeout=600,
                       env=ENV)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"grpo": _run_dir(out, "grpo"), "sft": _run_dir(out, "sft")}


def _source(request, which: str) -> Path:
    fixture, arm = which.split(":")
    return request.getfixturevalue(fixture)[arm]


def _copy(request, which: str, tmp_path: Path) -> Path:
    src = _source(request, which)
    return Path(shutil.copytree(src, tmp_path / "runs" / src.name))


# --- helpers that read what the tampering must be measured against


def _json(p: Path) -> dict:
    return json.loads(p.read_text())


def _write_json(p: Path, d: dict) -> None:
    p.write_text(json.dumps(d, indent=2))


def _final(run: Path) -> tuple[str, dict]:
    p = complete_checkpoints(run)[-1]
    return p.name, _json(p / CHECKPOINT_MANIFEST)


def _frontier(run: Path, rel: str, ckpt: Path | None = None) -> dict:
    m = _json((ckpt or complete_checkpoints(run)[-1]) / CHECKPOINT_MANIFEST)
    (f,) = [f for logs in m["frontier"].values() for f in logs.values() if f["path"] == rel]
    return f


def _lines(run: Path, rel: str) -> list[bytes]:
    return (run / rel).read_bytes().splitlines(keepends=True)


def _edit_line(run: Path, rel: str, i: int, edit: Callable[[bytes], bytes], *, same_length: bool = True) -> None:
    lines = _lines(run, rel)
    new = edit(lines[i])
    assert new != lines[i] and (len(new) == len(lines[i]) or not same_length), (lines[i], new)
    lines[i] = new
    (run / rel).write_bytes(b"".join(lines))


def _bump_tokens(line: bytes) -> tuple[bytes, int]:
    """The row with one token more (or less, to keep the byte length), and the change."""
    t = int(re.search(rb'"tokens":(\d+)', line).group(1))
    new = t + 1 if len(str(t + 1)) == len(str(t)) else t - 1
    return line.replace(b'"tokens":%d,' % t, b'"tokens":%d,' % new), new - t


def _tokens(run: Path, rel: str) -> int:
    return sum(r["tokens"] for r in read_rows(run / rel))


def _digest_mismatch(rel: str, f: dict, ckpt: str) -> Starts:
    return Starts(f"{rel}: bytes {f['segment_start']}..{f['offset']} do not match {ckpt}'s frontier digest "
                  f"{EDITED} {rel}")


# --- tamperings: each edits the copy and returns exactly the violations verify must report


def edit_ledger_tokens(run: Path) -> list[str]:
    """A ledger row's tokens changed in the final checkpoint's segment: the sums and the frontier disagree."""
    total, ckpt, f = _tokens(run, LEDGER0), _final(run)[0], _frontier(run, LEDGER0)
    delta = _bump_tokens(_lines(run, LEDGER0)[-1])[1]
    _edit_line(run, LEDGER0, -1, lambda line: _bump_tokens(line)[0])
    return [f"ledger tokens sum to {total + delta}, completion.json says {total}",
            f"{LEDGER0} sums to {total + delta} tokens, rank 0 counted {total}",
            _digest_mismatch(LEDGER0, f, ckpt)]


def edit_ledger_tokens_in_an_earlier_checkpoints_segment(run: Path) -> list[str]:
    """Every retained checkpoint's segment is re-hashed, not only the final one's."""
    older = complete_checkpoints(run)[0]
    assert older != complete_checkpoints(run)[-1]
    total, f = _tokens(run, LEDGER0), _frontier(run, LEDGER0, older)
    row = f["segment_start_rows"]  # the first row that checkpoint bound
    delta = _bump_tokens(_lines(run, LEDGER0)[row])[1]
    _edit_line(run, LEDGER0, row, lambda line: _bump_tokens(line)[0])
    return [f"ledger tokens sum to {total + delta}, completion.json says {total}",
            f"{LEDGER0} sums to {total + delta} tokens, rank 0 counted {total}",
            _digest_mismatch(LEDGER0, f, older.name)]


def edit_ledger_tokens_before_the_retained_checkpoints(run: Path) -> list[str]:
    """The caveat: retention deleted the checkpoint whose segment held the first rows, so only the sums see it."""
    oldest = complete_checkpoints(run)[0]
    assert len(_lines(run, LEDGER0)[0]) <= _frontier(run, LEDGER0, oldest)["segment_start"]
    total = _tokens(run, LEDGER0)
    delta = _bump_tokens(_lines(run, LEDGER0)[0])[1]
    _edit_line(run, LEDGER0, 0, lambda line: _bump_tokens(line)[0])
    return [f"ledger tokens sum to {total + delta}, completion.json says {total}",
            f"{LEDGER0} sums to {total + delta} tokens, rank 0 counted {total}"]


def duplicate_completion_ids(run: Path) -> list[str]:
    """Row 1 of the ledger and of the trace takes row 0's completion id (before any retained segment)."""
    first, second = (json.loads(line)["completion_id"] for line in _lines(run, LEDGER0)[:2])
    for rel in (LEDGER0, TRACE0):
        assert sum(map(len, _lines(run, rel)[:2])) <= _frontier(run, rel, complete_checkpoints(run)[0])["segment_start"]
        _edit_line(run, rel, 1, lambda line: line.replace(f'"{second}"'.encode(), f'"{first}"'.encode()))
    return [f"1 duplicate completion ids in the ledgers, e.g. {first}"]


def drop_last_trace_row(run: Path) -> list[str]:
    lines, (ckpt, _), f = _lines(run, TRACE0), _final(run), _frontier(run, TRACE0)
    (run / TRACE0).write_bytes(b"".join(lines[:-1]))
    size = sum(map(len, lines[:-1]))
    return [f"trace rows ({len(lines) - 1}) do not match ledger rows ({len(lines)}) one to one",
            Starts(f"{TRACE0}: {size} bytes, shorter than {ckpt}'s frontier at {f['offset']} bytes {EDITED} {TRACE0}")]


def reorder_trace_rows(run: Path) -> list[str]:
    """The first two trace rows swapped (before any retained segment): the one-to-one match sees it."""
    lines = _lines(run, TRACE0)
    (run / TRACE0).write_bytes(b"".join([lines[1], lines[0], *lines[2:]]))
    return [f"trace rows ({len(lines)}) do not match ledger rows ({len(lines)}) one to one"]


def append_a_completion_and_recount(run: Path) -> list[str]:
    """A completion appended after the final checkpoint, with completion.json recounted to match: every
    count agrees, only the frontier shows that no checkpoint ever bound the new rows."""
    ckpt, _ = _final(run)
    last = json.loads(_lines(run, LEDGER0)[-1])
    new_id = last["completion_id"].rsplit(":", 3)[0] + f":{last['step'] + 1}:0:0"
    for rel in (LEDGER0, TRACE0):
        row = {**json.loads(_lines(run, rel)[-1]), "completion_id": new_id}
        with open(run / rel, "a") as fh:
            fh.write(json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n")
    comp = _json(run / "completion.json")
    comp["realized_completion_tokens"] += last["tokens"]
    comp["realized_completion_count"] += 1
    comp["ranks"][0]["completion_tokens"] += last["tokens"]
    comp["ranks"][0]["completions"] += 1
    _write_json(run / "completion.json", comp)
    fronts = {rel: _frontier(run, rel) for rel in (LEDGER0, TRACE0)}
    return [Starts(f"{rel}: {(run / rel).stat().st_size} bytes, past the final {ckpt}'s frontier at {f['offset']} "
                   f"bytes ({f['rows']} rows): rows appended after the final checkpoint are unaccounted; fix: "
                   f"truncate {rel} to {f['offset']} bytes") for rel, f in fronts.items()]


def duplicate_metrics_row(run: Path) -> list[str]:
    """The last step logged twice (as a resume without rollback would)."""
    lines, (ckpt, _), f = _lines(run, METRICS), _final(run), _frontier(run, METRICS)
    (run / METRICS).write_bytes(b"".join([*lines, lines[-1]]))
    step = json.loads(lines[-1])["step"]
    return [Starts(f"{METRICS}: {f['offset'] + len(lines[-1])} bytes, past the final {ckpt}'s frontier at "
                   f"{f['offset']} bytes ({f['rows']} rows): rows appended after the final checkpoint are unaccounted"),
            f"metrics.jsonl has duplicate rows for steps [{step}]"]


def flip_final_policy_byte(run: Path) -> list[str]:
    p = run / "final_policy" / "model.safetensors"
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF
    p.write_bytes(bytes(data))
    return ["final_policy/model.safetensors: missing or its sha256 differs from harness_policy.json"]


def foreign_eval_artifact(run: Path) -> list[str]:
    """eval/test.json replaced by another run's (the SFT warm start's, same split and size)."""
    parent = Path(_json(run / "run_manifest.json")["parent"]["run_dir"])
    shutil.copyfile(parent / "eval" / "test.json", run / "eval" / "test.json")
    return [f"eval/test.json: identity.{k} is not this run's (an artifact of another run?)"
            for k in ("config_sha256", "semantic_sha256")]


def remove_eval_after(run: Path) -> list[str]:
    (run / "eval" / "test.json").unlink()
    return ["eval_after is recorded but eval/test.json is missing"]


def edit_plan_config(run: Path) -> list[str]:
    """A learning rate changed in the frozen plan: both hashes of plan.config no longer match the identity."""
    m = _json(run / "run_manifest.json")
    m["plan"]["config"]["arm"]["learning_rate"] *= 2
    _write_json(run / "run_manifest.json", m)
    ident = m["identity"]
    return [Starts(f"run_manifest.json: identity.config_sha256 {ident['config_sha256']} != sha256 of plan.config "),
            Starts(f"run_manifest.json: identity.semantic_sha256 {ident['semantic_sha256']} != recomputed ")]


def drop_the_last_event(run: Path) -> list[str]:
    """The manifest says completed, but its event log ends before the run completed."""
    m = _json(run / "run_manifest.json")
    m["events"].pop()
    _write_json(run / "run_manifest.json", m)
    return [f"run_manifest.json: status 'completed' but the last event says {m['events'][-1]['status']!r}"]


def leave_a_torn_write(run: Path) -> list[str]:
    """What a process killed inside atomic_write_json leaves behind."""
    (run / "checkpoints" / ".harness_checkpoint.json.x1y2.tmp").write_text('{"version": 1, "st')
    return ["leftover temp file from an interrupted atomic write: checkpoints/.harness_checkpoint.json.x1y2.tmp"]


def remove_completion(run: Path) -> list[str]:
    (run / "completion.json").unlink()
    return ["status is completed but completion.json is missing"]


def remove_checkpoints(run: Path) -> list[str]:
    shutil.rmtree(run / "checkpoints")
    return ["status is completed but no checkpoint was published"]


def move_a_token_between_ranks(run: Path) -> list[str]:
    """completion.json credits one of rank 1's tokens to rank 0: the total is right, each rank's count is not."""
    comp = _json(run / "completion.json")
    (r0, r1) = comp["ranks"]
    r0["completion_tokens"] += 1
    r1["completion_tokens"] -= 1
    _write_json(run / "completion.json", comp)
    return [f"{LEDGER0} sums to {r0['completion_tokens'] - 1} tokens, rank 0 counted {r0['completion_tokens']}",
            f"{LEDGER1} sums to {r1['completion_tokens'] + 1} tokens, rank 1 counted {r1['completion_tokens']}"]


def diverge_replica_digests(run: Path) -> list[str]:
    ckpt, m = _final(run)
    m["state_digests"]["rank-1"]["params"] = "0" * 64
    _write_json(run / "checkpoints" / ckpt / CHECKPOINT_MANIFEST, m)
    return [f"{ckpt}: the ranks' params digests differ (2 distinct): the replicas diverged"]


def edit_rank1_ledger_tokens(run: Path) -> list[str]:
    total, ckpt, f = _tokens(run, LEDGER1), _final(run)[0], _frontier(run, LEDGER1)
    delta = _bump_tokens(_lines(run, LEDGER1)[-1])[1]
    _edit_line(run, LEDGER1, -1, lambda line: _bump_tokens(line)[0])
    whole = _json(run / "completion.json")["realized_completion_tokens"]
    return [f"ledger tokens sum to {whole + delta}, completion.json says {whole}",
            f"{LEDGER1} sums to {total + delta} tokens, rank 1 counted {total}",
            _digest_mismatch(LEDGER1, f, ckpt)]


def edit_sft_loss_tokens(run: Path) -> list[str]:
    comp = _json(run / "completion.json")
    comp["realized_loss_tokens"] -= 1
    _write_json(run / "completion.json", comp)
    return [f"SFT trained on {comp['realized_loss_tokens']} loss tokens, the cap planned {comp['planned_loss_tokens']}"]


def edit_sft_first_loss(run: Path) -> list[str]:
    """One checkpoint binds SFT's whole metrics log (its segment starts at 0): an edit of the first row is seen."""
    ckpt, f = _final(run)[0], _frontier(run, METRICS)
    assert f["segment_start"] == 0

    def edit(line: bytes) -> bytes:
        m = re.search(rb'"loss":-?[\d.]*(\d)', line)
        digit = b"1" if m.group(1) != b"1" else b"2"
        return line[:m.start(1)] + digit + line[m.end(1):]

    _edit_line(run, METRICS, 0, edit)
    return [_digest_mismatch(METRICS, f, ckpt)]


TWO_RANKS = [pytest.mark.multiprocess, pytest.mark.slow]  # a two-rank source run costs ~40 s
def _flip(p: Path, at: int) -> None:
    data = bytearray(p.read_bytes())
    data[at] ^= 0x01
    p.write_bytes(bytes(data))


def flip_a_weight_in_the_final_checkpoint(run: Path) -> list[str]:
    """A byte inside a tensor of the weights (digest format 2 took that range's digest from memory at save)."""
    name, _ = _final(run)
    p = run / "checkpoints" / name / "model.safetensors"
    _flip(p, p.stat().st_size - 3)
    return [f"{name}/model.safetensors: xxh3 differs from the recorded digest"]


def flip_a_zip_record_of_the_optimizer_state(run: Path) -> list[str]:
    """A byte of optimizer.pt outside every stored entry: the zip's own records are hashed too."""
    name, _ = _final(run)
    p = run / "checkpoints" / name / "optimizer.pt"
    _flip(p, p.stat().st_size - 30)  # the end of the central directory
    return [f"{name}/optimizer.pt: xxh3 differs from the recorded digest"]


def as_format_1(run: Path) -> None:
    """The run dir as the harness wrote it before digest format 2: sha256 of whole files, no "digests"."""
    from harness.identity import sha256_file

    for c in complete_checkpoints(run):
        m = _json(c / CHECKPOINT_MANIFEST)
        m.pop("digests")
        m["files"] = {rel: {"sha256": sha256_file(c / rel), "size": f["size"]} for rel, f in m["files"].items()}
        _write_json(c / CHECKPOINT_MANIFEST, m)


def flip_an_optimizer_byte_of_a_format_1_run(run: Path) -> list[str]:
    as_format_1(run)
    name, _ = _final(run)
    p = run / "checkpoints" / name / "optimizer.pt"
    _flip(p, p.stat().st_size // 2)
    return [f"{name}/optimizer.pt: sha256 differs from the recorded digest"]


CASES = [
    pytest.param("one_rank:grpo", flip_a_weight_in_the_final_checkpoint, id="checkpoint-weight-byte-flipped"),
    pytest.param("one_rank:grpo", flip_a_zip_record_of_the_optimizer_state, id="checkpoint-zip-record-flipped"),
    pytest.param("one_rank:grpo", flip_an_optimizer_byte_of_a_format_1_run, id="format-1-optimizer-byte-flipped"),
    pytest.param("one_rank:grpo", edit_ledger_tokens, id="ledger-tokens-edited"),
    pytest.param("one_rank:grpo", edit_ledger_tokens_in_an_earlier_checkpoints_segment,
                 id="ledger-tokens-edited-in-an-earlier-segment"),
    pytest.param("one_rank:grpo", edit_ledger_tokens_before_the_retained_checkpoints,
                 id="ledger-tokens-edited-before-the-retained-segments"),
    pytest.param("one_rank:grpo", duplicate_completion_ids, id="duplicate-completion-ids"),
    pytest.param("one_rank:grpo", drop_last_trace_row, id="trace-row-dropped"),
    pytest.param("one_rank:grpo", reorder_trace_rows, id="trace-rows-reordered"),
    pytest.param("one_rank:grpo", append_a_completion_and_recount, id="completion-appended-and-recounted"),
    pytest.param("one_rank:grpo", duplicate_metrics_row, id="metrics-row-duplicated"),
    pytest.param("one_rank:grpo", flip_final_policy_byte, id="final-policy-byte-flipped"),
    pytest.param("one_rank:grpo", foreign_eval_artifact, id="foreign-eval-artifact"),
    pytest.param("one_rank:grpo", remove_eval_after, id="eval-after-missing"),
    pytest.param("one_rank:grpo", edit_plan_config, id="plan-config-edited"),
    pytest.param("one_rank:grpo", drop_the_last_event, id="last-event-dropped"),
    pytest.param("one_rank:grpo", leave_a_torn_write, id="torn-write-left-over"),
    pytest.param("one_rank:grpo", remove_completion, id="completion-missing"),
    pytest.param("one_rank:grpo", remove_checkpoints, id="no-checkpoint"),
    pytest.param("one_rank:sft", edit_sft_loss_tokens, id="sft-loss-tokens-edited"),
    pytest.param("one_rank:sft", edit_sft_first_loss, id="sft-metrics-edited"),
    pytest.param("two_ranks:grpo", move_a_token_between_ranks, id="per-rank-count-mismatch", marks=TWO_RANKS),
    pytest.param("two_ranks:grpo", diverge_replica_digests, id="replica-digests-diverged", marks=TWO_RANKS),
    pytest.param("two_ranks:grpo", edit_rank1_ledger_tokens, id="rank1-ledger-tokens-edited", marks=TWO_RANKS),
]


@pytest.mark.parametrize("which", [
    "one_rank:grpo", "one_rank:sft",
    pytest.param("two_ranks:grpo", marks=TWO_RANKS), pytest.param("two_ranks:sft", marks=TWO_RANKS),
])
def test_the_untampered_copy_verifies(request, tmp_path, which):
    assert verify(_copy(request, which, tmp_path)) == []


@pytest.mark.parametrize("which, tamper", CASES)
def test_tampering_is_reported_exactly(request, tmp_path, which, tamper):
    run = _copy(request, which, tmp_path)
    assert_violations(run, tamper(run))


def test_a_run_dir_of_digest_format_1_still_verifies(request, tmp_path):
    """Old run dirs (sha256 file digests, before issue 47) verify clean."""
    run = _copy(request, "one_rank:grpo", tmp_path)
    as_format_1(run)
    assert verify(run) == []


def test_a_run_dir_under_another_name(request, tmp_path):
    """Renamed (or moved over another run's name): the manifest's run_name no longer names its directory."""
    src = _source(request, "one_rank:grpo")
    run = Path(shutil.copytree(src, tmp_path / "runs" / "grpo-renamed"))
    assert_violations(run, [f"run_manifest.json: run_name {src.name!r} does not match the directory name "
                            "'grpo-renamed'"])


def test_cli_exits_1_and_lists_every_violation_on_stderr(request, tmp_path):
    run = _copy(request, "one_rank:grpo", tmp_path)
    ok = run_harness(str(run), module="harness.verify", timeout=120)
    assert ok.returncode == 0 and ok.stdout.startswith(f"ok: {run}"), ok.stderr
    here = run_harness(".", module="harness.verify", cwd=run, timeout=120)  # the directory's name is the run's
    assert here.returncode == 0 and here.stdout.startswith("ok: ."), here.stderr
    expected = edit_ledger_tokens(run)
    proc = run_harness(str(run), module="harness.verify", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == f"{len(expected)} violation(s) in {run}:", proc.stderr
    assert all(line.startswith("  - ") for line in lines[1:]), proc.stderr
    assert matches([line[4:] for line in lines[1:]], expected), proc.stderr
    assert proc.stdout == ""
