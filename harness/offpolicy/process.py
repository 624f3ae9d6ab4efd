"""The sampler process as the trainer sees it (harness.offpolicy): started at the trainer's first round, restarted
where it stopped if it dies (a fixed lag makes every round it samples again the same), stopped with training.
Torch-free."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.errors import HarnessError
from harness.offpolicy import DIR, POLL_S, round_path

log = logging.getLogger("harness")

MAX_RESTARTS = 3


class SamplerGone(HarnessError):
    """The sampler process stopped for good before sampling a round the trainer needs (exit 13). The checkpoints
    are intact: the same command resumes from the newest, with a new sampler."""

    exit_code = 13


def split_threads(total: int, asked: int | None) -> tuple[int, int]:
    """(the trainer's, the sampler's) torch threads on a CPU the two processes share: the sampler takes `asked`, or
    half of `total`; the trainer keeps the rest (at least one each)."""
    sampler = asked if asked is not None else max(1, total // 2)
    return max(1, total - sampler), sampler


def sampler_gpu(count: int, visible: str | None, trainer_index: int = 0) -> str | None:
    """The CUDA_VISIBLE_DEVICES value that gives the sampler a GPU of its own: the next visible device after the
    trainer's (`count` devices visible to the trainer, `visible` its CUDA_VISIBLE_DEVICES), or None with fewer than
    two (the sampler shares the trainer's device)."""
    if count < 2:
        return None
    ids = [x.strip() for x in visible.split(",") if x.strip()] if visible else [str(i) for i in range(count)]
    return ids[(trainer_index + 1) % len(ids)] if len(ids) >= 2 else None


class SamplerProcess:
    def __init__(self, run_dir: str | Path, *, lag: int | None, cap: int, cycle: int, token_share: int | None,
                 threads: int | None = None, gpu: str | None = None):
        self.run_dir, self.lag, self.cap, self.cycle, self.token_share = Path(run_dir), lag, cap, cycle, token_share
        self.threads = threads  # the sampler's torch threads on a shared CPU (None: torch's default)
        self.gpu = gpu  # the sampler's own GPU (its CUDA_VISIBLE_DEVICES: sampler_gpu), None: the trainer's device
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.log_path = self.run_dir / DIR / "sampler.log"

    def _start(self, start_round: int, tokens_used: int) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "harness.offpolicy.sampler", str(self.run_dir), "--start", str(start_round),
               "--tokens-used", str(tokens_used)]
        if self.token_share is not None:
            cmd += ["--token-share", str(self.token_share)]
        if self.threads is not None:
            cmd += ["--threads", str(self.threads)]
        env, where = self.placement()
        with open(self.log_path, "ab") as fh:
            fh.write(f"--- sampler from round {start_round} on {where} "
                     f"({time.strftime('%Y-%m-%dT%H:%M:%S')})\n".encode())
            fh.flush()
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        log.info("off-policy: sampler process %d from round %d, %s, on %s (its log: %s)", self.proc.pid, start_round,
                 f"lag {self.lag}" if self.lag is not None else f"free running (age cap {self.cap})", where,
                 self.log_path)

    def placement(self) -> tuple[dict, str]:
        """(the sampler process's environment, where it runs in words): its own GPU through CUDA_VISIBLE_DEVICES,
        else the trainer's environment as it is."""
        env = dict(os.environ)
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
            return env, f"GPU {self.gpu} of its own"
        return env, f"{self.threads} CPU thread(s)" if self.threads else "the trainer's device"

    def wait(self, rnd: int, *, tokens_used: int) -> None:
        """Until round `rnd` is in the buffer. `tokens_used`: the tokens sampled before it (the budget's count, for a
        sampler started here). A sampler that died is restarted at `rnd` up to MAX_RESTARTS times; then, or when it
        finished without sampling `rnd`, SamplerGone says why and where its log is."""
        path = round_path(self.run_dir, rnd)
        if self.proc is None:
            self._start(rnd, tokens_used)
        while not path.exists():
            code = self.proc.poll()
            if code is not None and not path.exists():
                if code == 0:
                    raise SamplerGone(f"SamplerGone: the off-policy sampler finished its schedule without sampling "
                                      f"round {rnd}: its budget rule stopped earlier than the trainer's (a bug: see "
                                      f"{self.log_path}); the same command resumes from the newest checkpoint")
                if self.restarts >= MAX_RESTARTS:
                    raise SamplerGone(f"SamplerGone: the off-policy sampler process exited with code {code} before "
                                      f"sampling round {rnd}, after {self.restarts} restart(s): its log, "
                                      f"{self.log_path}, says why; once that is fixed the same command resumes "
                                      "from the newest checkpoint")
                self.restarts += 1
                log.warning("off-policy: the sampler exited with code %s before round %d; restarting it there "
                            "(%d of %d)", code, rnd, self.restarts, MAX_RESTARTS)
                self._start(rnd, tokens_used)
            time.sleep(POLL_S)

    def oldest_needed(self, rnd: int) -> int:
        """The oldest policy version a round still to be sampled can need: on this run's way on from round `rnd`, or
        on a resume from any checkpoint still kept (rounds from the checkpoint's on). Free running the sampler never
        reaches back further than the cap (harness.offpolicy.sampler.choose_version)."""
        from harness.accounting.checkpoint import complete_checkpoints, step_of

        starts = [step_of(p) // self.cycle for p in complete_checkpoints(self.run_dir)]
        return max(0, min([rnd, *starts]) - (self.lag if self.lag is not None else self.cap))

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
