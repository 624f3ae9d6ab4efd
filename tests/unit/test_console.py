"""The console: harness lines go above a live progress bar, never glued to its end; s/step counts training only."""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

from tqdm.auto import tqdm

from harness import kinds
from harness.run import callbacks
from harness.run.callbacks import MetricsCallback, console_line
from harness.run.context import RunContext
from harness.log import BarSafeHandler


def _logger(stream: io.StringIO) -> logging.Logger:
    lg = logging.getLogger("harness.test_console")
    lg.handlers[:] = []
    handler = BarSafeHandler(stream)
    handler.setFormatter(logging.Formatter("[harness] %(message)s"))
    lg.addHandler(handler)
    lg.propagate = False
    lg.setLevel(logging.INFO)
    return lg


def test_a_line_goes_above_a_live_bar_on_a_line_of_its_own():
    out = io.StringIO()
    lg = _logger(out)
    bar = tqdm(total=100, file=out, desc="sampled tokens", mininterval=0, ncols=80)
    bar.update(10)
    lg.info("step 1 | reward 0.5")
    bar.update(10)
    bar.close()
    text = out.getvalue()
    # the bar's line is cleared first ('\r'), the line ends with its own newline, and the bar is redrawn after it
    assert "\r[harness] step 1 | reward 0.5\n" in text, repr(text)
    assert "tok" not in text.split("[harness] step 1")[0].rsplit("\r", 1)[-1]
    assert "20/100" in text.split("[harness] step 1 | reward 0.5\n")[1]


def test_without_a_bar_lines_are_plain():
    out = io.StringIO()
    _logger(out).info("plain")
    assert out.getvalue() == "[harness] plain\n"


def test_seconds_per_step_count_this_processes_training_steps_only(monkeypatch):
    """A resumed run's first step here is step 6: 3 steps in 0.3 s is 0.1 s/step, whatever came before (the data,
    the model build, the eval before, the five steps of an earlier process)."""
    plan = SimpleNamespace(kind=kinds.of("sft"), budget={"loss_token_ceiling": 1000})
    ctx = RunContext(plan=plan, run_dir=None, rank=0, world=1)
    cb = MetricsCallback(ctx, console=False)
    cb.on_step_begin(None, SimpleNamespace(global_step=5), None)
    t0 = ctx.step_clock[0]
    cb.on_step_begin(None, SimpleNamespace(global_step=6), None)  # later steps do not move the clock
    assert ctx.step_clock == (t0, 5)
    ctx.step_clock = (1000.0, 5)
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(time=lambda: 1000.3))  # a fixed clock: a stall changes nothing
    line = console_line(8, 100, {"loss": 1.0}, ctx)
    assert line.endswith(" 0.10 s/step"), line
