"""Two ranks on this CPU (gloo), with the real trainers: `accelerate launch ... -m harness`, the driver form
`python -m harness placement=ddp ...`, resume after a kill, a multirun of multi-process jobs, and evi_po with
ranks that run different numbers of forwards. Every launch has a timeout that proves it did not hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from harness.verify import verify
from tests.conftest import REPO, run_harness, signal_harness

pytestmark = pytest.mark.multiprocess
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def accelerate_launch(*overrides: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """The acceptance command: accelerate launch --multi_gpu --num_processes 2 ... -m harness <overrides>."""
    return subprocess.run([*LAUNCH, "-m", "harness", *overrides], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _run(out: Path, arm: str) -> Path:
    (d,) = [p for p in (out / "runs").iterdir() if p.name.startswith(arm + "-")]
    return d


def check_two_rank_run(run: Path) -> dict:
    comp = json.loads((run / "completion.json").read_text())
    assert comp["status"] == "completed" and comp["world_size"] == 2
    for rk in comp["ranks"]:
        rows = list(read_rows(run / "ledgers" / f"rank-{rk['rank']}.jsonl"))
        assert rows and sum(r["tokens"] for r in rows) == rk["completion_tokens"]
        assert len(rows) == rk["completions"]
    assert sum(rk["completion_tokens"] for rk in comp["ranks"]) == comp["realized_completion_tokens"] \
        <= comp["completion_token_ceiling"]
    assert verify(run) == []  # incl. unique ids across ranks, and equal replicas in every checkpoint
    if "completion_token_ceiling" in comp:
        check_budget_stop(run, comp)
    return comp


def check_budget_stop(run: Path, comp: dict) -> None:
    """Each rank holds ceiling // world of the budget; after every step the ranks all-reduce (MIN) whether each can
    still afford the next round's worst case. So: both ranks' ledgers end at the same step, every earlier step
    left every rank room for the next one, the last step left at least one rank without it, and the stop is a
    permanent checkpoint at that step (the budget, not max_steps, ended the run)."""
    from harness.accounting.checkpoint import CHECKPOINT_MANIFEST, complete_checkpoints
    from harness.rounds import GenerationRound

    plan = json.loads((run / "run_manifest.json").read_text())["plan"]
    world = comp["world_size"]
    rnd = GenerationRound.of(plan["config"]["arm"], world=world)
    share, last = comp["completion_token_ceiling"] // world, comp["optimizer_steps"]
    assert comp["stopped_by"] == "budget" and last < plan["budget"]["max_steps"], (comp["stopped_by"], last)
    spent = []  # spent[r][g]: rank r's tokens after g optimizer steps
    for r in range(world):
        per_step = [0] * last
        for row in read_rows(run / "ledgers" / f"rank-{r}.jsonl"):
            per_step[row["step"]] += row["tokens"]
        assert per_step[rnd.cycle * ((last - 1) // rnd.cycle)] > 0, f"rank {r} did not sample the last round"
        spent.append([sum(per_step[:g]) for g in range(last + 1)])
    room = [[spent[r][g] + (rnd.token_bound // world if rnd.opens_round(g) else 0) <= share for r in range(world)]
            for g in range(last + 1)]
    assert all(all(room[g]) for g in range(1, last)), "a rank went on although the next round could overflow it"
    assert not all(room[last]), "stopped although every rank could afford the next round"
    final = json.loads((complete_checkpoints(run)[-1] / CHECKPOINT_MANIFEST).read_text())
    assert final["step"] == last and final["permanent"] and final["totals"]["stopped_by_budget"]


@pytest.mark.parametrize("arm, extra", [
    pytest.param("grpo", [], marks=pytest.mark.slow),  # ~45 s; .ci/run runs this file's slow tests early
    pytest.param("papo", [], marks=pytest.mark.slow),  # the same launch path as grpo; ~30 s
    # 4 micro-batches per step: rank 0 holds every view's first completion, so only rank 0 runs the
    # direction forward through the DDP model (84 vs 52 forwards, counted); with DDP's buffer broadcast
    # per forward this configuration hung.
    pytest.param("evi_po", ["arm.gradient_accumulation_steps=4"], marks=pytest.mark.slow),  # ~50 s
])
def test_accelerate_launch_two_ranks(tiny, tmp_path, arm, extra):
    """grpo trains its warm start on the two ranks too; papo and evi_po start from a copy of this session's
    (one rank: the same run, placement is not part of its identity), which their launch takes as it is."""
    own = arm == "grpo"
    out = tmp_path if own else tiny.case(tmp_path)
    proc = accelerate_launch(f"arm={arm}", "debug=tiny", "placement=ddp", f"output_root={out}", *tiny.cache, *extra)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = _run(tmp_path, arm)
    check_two_rank_run(run)
    ckpts = sorted((run / "checkpoints").glob("checkpoint-*"))
    manifest = json.loads((ckpts[-1] / "harness_checkpoint.json").read_text())
    assert set(manifest["frontier"]) == set(manifest["state_digests"]) == set(manifest["rank_totals"]) == \
        {"rank-0", "rank-1"}
    assert (ckpts[-1] / "rng_state_0.pth").is_file() and (ckpts[-1] / "rng_state_1.pth").is_file()
    parent = Path(json.loads((run / "run_manifest.json").read_text())["parent"]["run_dir"])
    sft = json.loads((parent / "completion.json").read_text())
    assert sft["world_size"] == (2 if own else 1) and sft["realized_loss_tokens"] == sft["planned_loss_tokens"]
    if own:  # its two ranks trained the planned loss tokens between them
        assert sft["realized_loss_tokens"] == sum(r["trained_loss_tokens"] for r in sft["ranks"])


@pytest.mark.slow  # ~60 s; the two-rank launch: test_accelerate_launch_two_ranks
def test_driver_form_and_resume_after_a_kill(tiny, tmp_path):
    """`python -m harness placement=ddp placement.num_processes=2`: Hydra in this process, the ranks in an
    accelerate child. Killed (SIGKILL, every rank) in the step after checkpoint 2 and run again: both ranks'
    audits pass and the run is bitwise the uninterrupted one (ledgers and final weights). Both start from a copy
    of this session's warm start."""
    args = ["arm=evi_po", "placement=ddp", "placement.num_processes=2", "debug=tiny", *tiny.cache]
    whole = tiny.case(tmp_path / "whole")
    proc = run_harness(*args, f"output_root={whole}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "launching 2 ranks" in proc.stderr
    reference = _run(whole, "evi_po")
    check_two_rank_run(reference)
    assert (whole / "launch" / reference.name / "plan.json").is_file()

    cut = tiny.case(tmp_path / "cut")
    kill = {"HARNESS_SMOKE_KILL_RUN": reference.name, "HARNESS_SMOKE_KILL_STEP": "3"}
    first = run_harness(*args, f"output_root={cut}", env=kill, timeout=300)
    assert first.returncode != 0
    run = _run(cut, "evi_po")
    assert not (run / "completion.json").exists()
    second = run_harness(*args, f"output_root={cut}", timeout=300)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resuming from checkpoint-2" in second.stderr
    audits = sorted(p.name for p in (run / "audits").iterdir())
    assert audits == ["resume-1-rank-0.json", "resume-1-rank-1.json"]
    for a in audits:
        assert json.loads((run / "audits" / a).read_text())["status"] == "passed"
    check_two_rank_run(run)
    for r in (0, 1):
        ids = lambda d: [(x["completion_id"], x["tokens"]) for x in read_rows(d / f"ledgers/rank-{r}.jsonl")]  # noqa
        assert ids(run) == ids(reference)
    assert (run / "final_policy/model.safetensors").read_bytes() == \
        (reference / "final_policy/model.safetensors").read_bytes()


@pytest.mark.slow
def test_multirun_of_two_rank_jobs(tmp_path):
    proc = run_harness("-m", "arm=sft", "seed=0,1", "placement=ddp", "debug=tiny", "budget.max_steps=4",
                       f"output_root={tmp_path}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (sweep,) = (tmp_path / "sweeps").iterdir()
    summary = json.loads((sweep / "sweep.json").read_text())
    assert summary["completed"] == 2
    for job in summary["runs"]:
        comp = json.loads((Path(job["run_dir"]) / "completion.json").read_text())
        assert comp["world_size"] == 2 and comp["optimizer_steps"] == 4


def test_world_size_must_match_the_placement(tmp_path):
    proc = accelerate_launch("debug=tiny", f"output_root={tmp_path}", timeout=120)
    assert proc.returncode != 0
    assert "placement.num_processes = 1" in proc.stderr and "--num_processes 1" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # ~35 s
def test_resume_with_another_world_size_is_refused(tmp_path):
    args = ["arm=sft", "debug=tiny", "budget.max_steps=6", f"output_root={tmp_path}"]
    plan = json.loads(run_harness("mode=plan", *args).stdout)
    first = run_harness(*args, env={"HARNESS_SMOKE_KILL_RUN": plan["run_name"], "HARNESS_SMOKE_KILL_STEP": "3"},
                        timeout=300)
    assert first.returncode != 0
    again = run_harness(*args, "placement=ddp", timeout=300)
    assert again.returncode == 5, again.stderr[-3000:]
    assert "written by 1 rank(s), this launch has 2" in again.stderr and "placement.num_processes=1" in again.stderr


@pytest.mark.slow  # the two-rank launch and the kill/resume above cover what smoke checks
def test_smoke_self_test_with_two_ranks(tmp_path):
    proc = run_harness("run_mode=smoke", "placement=ddp", "arm=grpo", "debug=tiny", f"output_root={tmp_path}",
                       timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "first launch (2 ranks) killed by SIGKILL" in proc.stderr and "smoke: passed" in proc.stderr


@pytest.mark.slow
def test_driver_form_sigterm_checkpoints_once_with_both_frontiers_and_resumes(tmp_path):
    """SIGTERM to the driver of a 2-rank job (what SLURM sends on preemption): it passes the signal on, both ranks
    finish the same step, one checkpoint is published with both ranks' frontiers, the run is `interrupted`, the
    driver exits 143; the same command resumes from that checkpoint on both ranks and completes."""
    from harness.accounting.checkpoint import CHECKPOINT_MANIFEST

    out = tmp_path / "out"
    args = ["placement=ddp", "placement.num_processes=2", "debug=tiny", "arm.init=scratch", f"output_root={out}"]
    code, err = signal_harness(*args, when="checkpoint 2 published", signals=(signal.SIGTERM,))
    assert code == 143, err[-4000:]
    run = _run(out, "grpo")
    m = json.loads((run / "run_manifest.json").read_text())
    step = m["halt"]["step"]
    assert m["status"] == "interrupted" and m["halt"]["signal"] == "SIGTERM" and step >= 3
    published = sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*"))
    assert published == ["checkpoint-2", f"checkpoint-{step}"]  # once, at the step both ranks agreed on
    ck = json.loads((run / "checkpoints" / f"checkpoint-{step}" / CHECKPOINT_MANIFEST).read_text())
    assert set(ck["frontier"]) == {"rank-0", "rank-1"} and all("ledger" in f for f in ck["frontier"].values())
    assert not (run / "completion.json").exists()
    again = run_harness(*args, timeout=300)
    assert again.returncode == 0, again.stderr[-4000:]
    assert f"resuming from checkpoint-{step}" in again.stderr
    for r in (0, 1):
        assert json.loads((run / "audits" / f"resume-1-rank-{r}.json").read_text())["status"] == "passed"
    check_two_rank_run(run)


@pytest.mark.slow
def test_driver_form_sigusr1_writes_both_ranks_stacks_and_the_run_goes_on(tmp_path):
    """SIGUSR1 to the driver of a 2-rank job: passed on to the ranks only (torchrun's agent would die of it),
    each writes diagnostics/stacks-<rank>-<time>.txt, and the run completes."""
    out = tmp_path / "out"
    args = ["placement=ddp", "placement.num_processes=2", "debug=tiny", "arm.init=scratch", f"output_root={out}"]
    code, err = signal_harness(*args, when="checkpoint 2 published", signals=(signal.SIGUSR1,))
    assert code == 0, err[-4000:]
    run = _run(out, "grpo")
    for r in (0, 1):
        (stacks,) = (run / "diagnostics").glob(f"stacks-{r}-*.txt")
        assert "File " in stacks.read_text()
    check_two_rank_run(run)


HUNG_PEER = """
import sys, time
import torch, torch.distributed as td
from harness import dist
dist.init("cpu", timeout_s=float(sys.argv[1]))
if dist.rank() == 1:
    time.sleep(float(sys.argv[2]))  # alive but silent: never joins the collective in time
td.all_reduce(torch.ones(1)) if dist.rank() == 1 else None
if dist.rank() == 0:
    try:
        td.all_reduce(torch.ones(1))
        print("JOINED")
    except Exception as exc:
        print("LOST", dist.peer_lost(exc))
"""


@pytest.mark.slow  # ~15 s: a 3 s timeout, a rank silent for 10 s
def test_the_collective_timeout_bounds_the_wait_for_a_silent_rank(tmp_path):
    """placement.collective_timeout_s means what it says: a rank whose peer is alive but never joins a collective
    gives up after that many seconds with an error the lifecycle reports as PeerLostError (exit 12), instead of
    waiting until the peer wakes up; with a timeout longer than the peer's silence, the collective completes."""
    script = tmp_path / "hung.py"
    script.write_text(HUNG_PEER)

    def launch(timeout_s: int, silent_s: int) -> str:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                               "--master_port", str(29000 + os.getpid() % 1000), str(script), str(timeout_s),
                               str(silent_s)], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
        return proc.stdout

    out = launch(3, 10)  # the silent rank wakes after 10 s: the first rank gave up at 3
    assert "LOST" in out and "JOINED" not in out, out
    detail = out.split("LOST", 1)[1]
    assert "None" not in detail.split("\n")[0], f"peer_lost did not recognise the timeout: {out}"
    assert "JOINED" in launch(30, 2)
