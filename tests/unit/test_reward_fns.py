"""Your own reward (harness.rewards.functions): targets found and checked without importing them, their identity, the
one calling form, the built-in as one implementation of it, and every bad reward refused naming the function."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from harness.rewards.functions import BUILTIN, RewardFunctionError, Rewards, ast_params, reward_problems, split_target
from harness.rewards.identity import reward_identity
from harness.rewards import RewardCfg, answer_reward, score

ROWS = [
    {"key": "a:full", "relation": "FULL", "answer_type": "word", "target": "red", "choices": None, "question": "q?",
     "meta": None},
    {"key": "b:full", "relation": "FULL", "answer_type": "number", "target": "3", "choices": None, "question": "q?",
     "meta": {"data_source": "mine"}},
    {"key": "c:missing", "relation": "MISSING", "answer_type": "word", "target": "", "choices": None, "question": "q?",
     "meta": None},
]
TEXTS = ["<answer>Red</answer>", "<answer>three</answer>", "no tags"]


def _completions(texts=TEXTS):
    return [[{"role": "assistant", "content": t}] for t in texts]


def _reward(**extra) -> dict:
    return {"_target_": BUILTIN, "convention": "trl", "kwargs": {}, "components": {}, "success_threshold": 1.0,
            "correct": 1.0, "format_weight": 0.0, "invalid_penalty": 0.5, **extra}


def _score(rewards: Rewards, texts=TEXTS, truncated=(False, False, False), state=None):
    return rewards.score([[{"role": "user", "content": "q?"}]] * len(texts), _completions(texts),
                         [[5, 6, 0]] * len(texts), ROWS[:len(texts)], list(truncated), state)


@pytest.fixture
def reward_file(tmp_path):
    """A reward file outside the package, written by the test: (path, write(source))."""
    path = tmp_path / "rewards" / "mine.py"
    path.parent.mkdir()

    def write(source: str) -> str:
        path.write_text(source)
        return str(path)

    return path, write


GOOD = '''
import json, os

def exact(prompts, completions, completion_ids, target, bonus=0.0, **kwargs):
    out = [(1.0 if c[0]["content"] == f"<answer>{t}</answer>" else 0.0) + bonus for c, t in zip(completions, target)]
    return out

def length(prompts, completions, completion_ids, **kwargs):
    return [-len(ids) for ids in completion_ids]

def columns(prompts, completions, completion_ids, **kwargs):
    seen = {k: v for k, v in kwargs.items() if k != "trainer_state"}
    with open(os.environ["SEEN"], "w") as fh:
        json.dump(seen, fh)
    return [0.0] * len(completions)
'''


def test_targets_parse_in_the_three_spellings():
    assert split_target("rewards/mine.py:exact") == ("rewards/mine.py", None, "exact")
    assert split_target("pkg.mod:fn") == (None, "pkg.mod", "fn")
    assert split_target("pkg.mod.fn") == (None, "pkg.mod", "fn")  # Hydra's _target_ spelling
    assert "function" in split_target("rewards/mine.py")
    assert "name" in split_target("mine.py:not-a-name")


def test_the_builtin_alone_is_exactly_the_answer_schema_score():
    """Nothing changes for the default: each trace is harness.rewards.score's, bit for bit."""
    got = _score(Rewards(_reward(format_weight=0.25)), truncated=(False, True, False))
    cfg = RewardCfg(1.0, 0.25, 0.5)
    want = [score(t, r, truncated=tr, cfg=cfg) for t, r, tr in zip(TEXTS, ROWS, (False, True, False))]
    assert got == want


def test_the_builtin_is_one_implementation_of_the_calling_form():
    """answer_reward called as TRL calls a reward function gives the totals the ledger records."""
    rewards = Rewards(_reward(format_weight=0.25))
    cols = rewards.columns(ROWS, [False, True, False])
    via_form = answer_reward(["q"] * 3, _completions(), [[1]] * 3, correct=1.0, format_weight=0.25,
                             invalid_penalty=0.5, trainer_state=None, **cols)
    assert via_form == [t.total for t in _score(rewards, truncated=(False, True, False))] == [1.25, -0.5, -0.5]


def test_a_custom_reward_its_kwargs_and_weighted_components(reward_file, monkeypatch, tmp_path):
    path, write = reward_file
    target = write(GOOD)
    monkeypatch.setenv("SEEN", str(tmp_path / "seen.json"))
    cfg = _reward(_target_=f"{target}:exact", kwargs={"bonus": 0.5},
                  components={"short": {"_target_": f"{target}:length", "weight": 0.1},
                              "cols": {"_target_": f"{target}:columns", "weight": 2.0}})
    assert reward_problems(cfg) == []
    traces = _score(Rewards(cfg, data_source="jsonl"), texts=["<answer>red</answer>", "<answer>3</answer>", "x"])
    assert [t.components for t in traces] == [{"exact": 1.5, "cols": 0.0, "short": pytest.approx(-0.3)}] * 2 + \
        [{"exact": 0.5, "cols": 0.0, "short": pytest.approx(-0.3)}]
    assert [t.total for t in traces] == [sum(t.components.values()) for t in traces]
    # correct = the main reward reaches reward.success_threshold (1.0); the answer schema's reading stays
    assert [t.correct for t in traces] == [True, True, False]
    assert [t.prediction for t in traces] == ["red", "3", None]
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["target"] == ["red", "3", ""] and seen["truncated"] == [False] * 3
    assert seen["data_source"] == ["jsonl", "mine", "jsonl"] and seen["key"] == ["a:full", "b:full", "c:missing"]
    assert set(seen) == {"target", "answer_type", "relation", "question", "key", "choices", "meta", "truncated",
                         "data_source"}


@pytest.mark.parametrize("body, why", [
    ("return [float('nan')] * len(completions)", "returned nan for completion 0 of the call (view a:full)"),
    ("return [1.0]", "(trl convention) returned 1 results for 3 completions"),
    ("return [1.0, None, 2.0]", "(trl convention) returned None (NoneType) for completion 1"),
    ("return 1.0", "(trl convention) returned 1.0 (float) for 3 completions"),
    ("raise KeyError('solution')", "raised KeyError scoring 3 completions"),
])
def test_bad_rewards_are_refused_naming_the_function_and_the_completion(reward_file, body, why):
    _, write = reward_file
    target = write(f"def bad(prompts, completions, completion_ids, **kw):\n    {body}\n")
    with pytest.raises(RewardFunctionError) as err:
        _score(Rewards(_reward(_target_=f"{target}:bad")))
    text = str(err.value)
    assert f"reward._target_={target}:bad" in text and why in text, text
    if "raised" in why:  # the user's traceback, once: its own line, not the harness's frames
        assert text.count("Traceback") == 1 and "raise KeyError('solution')" in text and "reward_fns.py" not in text


def test_a_failing_call_writes_no_ledger_row(reward_file, tmp_path):
    """The reward is computed before the ledger: a failing function leaves no trace of the step (resumable)."""
    from harness.accounting.ledger import HarnessReward
    from harness.accounting.logs import AppendLog
    from harness.rounds import GenerationRound

    _, write = reward_file
    target = write("def bad(prompts, completions, completion_ids, **kw):\n    raise RuntimeError('judge down')\n")
    rnd = GenerationRound(prompts_per_step=1, num_generations=3, steps_per_generation=1, num_iterations=1,
                          gradient_accumulation_steps=1, max_completion_length=16, world=1)
    ctx = SimpleNamespace(rank=0, world=1, tokens_used=0, completions=0, round=rnd,
                          ledger=AppendLog(tmp_path, "ledgers/rank-0.jsonl"), trace=AppendLog(tmp_path, "traces/rank-0.jsonl"))
    fn = HarnessReward(ctx, rewards=Rewards(_reward(_target_=f"{target}:bad")), eos_token_ids=[0],
                       provenance={"semantic_sha256": "abcdef0123"})
    with pytest.raises(RewardFunctionError, match="judge down"):
        fn(prompts=["p"] * 3, completions=_completions(), completion_ids=[[5, 0]] * 3,
           trainer_state=SimpleNamespace(global_step=0), row=[json.dumps(r) for r in ROWS])
    ctx.ledger.close()
    ctx.trace.close()
    assert ctx.tokens_used == 0
    assert not (tmp_path / "ledgers/rank-0.jsonl").exists() or (tmp_path / "ledgers/rank-0.jsonl").read_text() == ""


def test_plan_time_problems_without_importing_the_file(reward_file, tmp_path):
    path, write = reward_file
    target = write("import not_a_module_anywhere\n\ndef fine(prompts, completions, completion_ids, **kw):\n"
                   "    return [0.0]\n\nasync def later(prompts, completions, completion_ids, **kw):\n    pass\n")
    # the import error is the run's to report (plan time reads the source only)
    assert reward_problems(_reward(_target_=f"{target}:fine")) == []
    (p,) = reward_problems(_reward(_target_=f"{target}:missing"))
    assert p.field == "reward._target_" and "defines no top-level 'missing' (its functions: fine)" in p.why
    (p,) = reward_problems(_reward(_target_=f"{target}:later"))
    assert "async" in p.why
    (p,) = reward_problems(_reward(_target_=str(tmp_path / "nowhere.py") + ":f"))
    assert "does not exist" in p.why and "directory you run in" in p.why
    (p,) = reward_problems(_reward(_target_="no_such_pkg.mod:f"))
    assert "cannot be found" in p.why
    (p,) = reward_problems(_reward(_target_=f"{target}:fine", format_weight=0.1))
    assert p.field == "reward.format_weight" and "built-in" in p.why
    (p,) = reward_problems(_reward(components={"len": {"_target_": f"{target}:fine", "wieght": 0.1}}))
    assert p.field == "reward.components.len.wieght"
    (p,) = reward_problems(_reward(components={"len": "file.py:fn"}))
    assert p.field == "reward.components.len" and "_target_" in p.fix


def test_a_wrong_signature_is_refused_at_plan_time(reward_file):
    _, write = reward_file
    target = write("def two(completions, solution, *, scale=1.0):\n    return [0.0] * len(completions)\n\n"
                   "def verl_style(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    assert ast_params(target, "two") == [("completions", "POSITIONAL_OR_KEYWORD", False),
                                         ("solution", "POSITIONAL_OR_KEYWORD", False), ("scale", "KEYWORD_ONLY", True)]
    (p,) = reward_problems(_reward(_target_=f"{target}:two"))
    assert p.field == "reward._target_" and "trl convention" in p.why and "**kwargs" in p.why
    # a verl function is refused as a TRL one, and accepted with its convention
    assert reward_problems(_reward(_target_=f"{target}:verl_style"))
    assert reward_problems(_reward(_target_=f"{target}:verl_style", convention="verl")) == []
    (p,) = reward_problems(_reward(_target_=f"{target}:verl_style", convention="verl", kwargs={"target": 1}))
    assert p.field == "reward.kwargs" and "target" in p.why


def test_an_import_error_is_refused_when_the_run_loads_it(reward_file):
    _, write = reward_file
    target = write("import not_a_module_anywhere\n\ndef fine(prompts, completions, completion_ids, **kw):\n"
                   "    return [0.0] * len(completions)\n")
    with pytest.raises(RewardFunctionError) as err:
        Rewards(_reward(_target_=f"{target}:fine"))
    assert f"reward._target_={target}:fine: importing it failed" in str(err.value)
    assert "No module named 'not_a_module_anywhere'" in str(err.value)


COMMENTED = '''
import json, os  # the standard library only


def exact(prompts, completions, completion_ids, target, bonus=0.0, **kwargs):
    # one point for the exact answer, plus the bonus
    out = [(1.0 if c[0]['content'] == f'<answer>{t}</answer>' else 0.0) + bonus
           for c, t in zip(completions, target)]
    return out
'''  # GOOD's exact with comments, blank lines, other quotes and line breaks; and without the other functions


def test_identity_follows_the_code_not_the_comments(reward_file, tmp_path):
    """identity.reward carries the digest of the parsed code (what the run name carries and a resume compares): a
    comment or a reformat keeps it, a change of the code or of a docstring does not. The file's bytes are recorded
    beside it. mismatch_fix, for a run dir reached with another reward all the same, names the file, never a seed."""
    from harness.rundir import identity_diffs, mismatch_fix

    _, write = reward_file
    target = write(GOOD)
    cfg = _reward(_target_=f"{target}:exact")
    before = reward_identity(cfg)
    fn = before["functions"]["main"]
    assert fn["file"] == target and fn["code_sha256"] == before["main_code_sha256"] and fn["source_sha256"]
    assert before["code_sha256"] and "main_source_sha256" not in before
    assert reward_identity(_reward()) == {"functions": {"main": {  # the code identity covers the built-in
        "target": BUILTIN, "convention": "trl", "file": None, "source_sha256": None, "code_sha256": None}}}
    write(GOOD + "\n# tuned\n\n\n")
    commented = reward_identity(cfg)
    assert commented["functions"]["main"]["source_sha256"] != fn["source_sha256"]  # the bytes changed
    assert identity_diffs({"reward": before}, {"reward": commented}) == []  # the code did not: the same run
    write(GOOD.replace("import json, os", "import os, json"))
    assert reward_identity(cfg)["main_code_sha256"] != fn["code_sha256"]  # any edit of the code counts
    write('"""Exact match."""' + GOOD)
    assert reward_identity(cfg)["main_code_sha256"] != fn["code_sha256"]  # a docstring too (it is code: __doc__)
    write(GOOD.replace("+ bonus", "+ 2 * bonus"))
    after = reward_identity(cfg)
    diffs = identity_diffs({"reward": before}, {"reward": after})
    assert [d.field for d in diffs] == ["identity.reward.code_sha256", "identity.reward.main_code_sha256"]
    fix = mismatch_fix(tmp_path / "run", diffs, {"identity": {"reward": before}})
    assert f"({target})" in fix and "seed" not in fix


def test_the_code_digest_ignores_layout_only(tmp_path):
    """Two layouts of one code are one digest; a coding declaration decodes the literals as the import does; a file
    that does not parse is digested as bytes."""
    from harness.rewards.identity import code_sha256

    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text(GOOD)
    b.write_text(COMMENTED)
    c.write_text(GOOD.split("def length")[0])
    assert code_sha256(str(b)) == code_sha256(str(c)) != code_sha256(str(a))
    a.write_bytes("# -*- coding: latin-1 -*-\nX = 'é'\n".encode("latin-1"))
    b.write_bytes("X = 'é'\n".encode("utf-8"))
    assert code_sha256(str(a)) == code_sha256(str(b))
    c.write_bytes(b"\x7fELF\x00 not python")
    import hashlib

    assert code_sha256(str(c)) == hashlib.sha256(c.read_bytes()).hexdigest()


def test_eval_refuses_a_reward_edited_since_the_run(reward_file):
    """python -m harness.eval of a run: the same code scores it (a comment edit too), an edited code is refused; a run
    planned before code_sha256 (its identity has the file's bytes) is checked on the bytes."""
    from harness.errors import ResumeMismatchError
    from harness.rewards.identity import check_sources

    _, write = reward_file
    target = write(GOOD)
    cfg = _reward(_target_=f"{target}:exact")
    recorded = reward_identity(cfg)
    older = {"functions": recorded["functions"], "main_source_sha256": recorded["functions"]["main"]["source_sha256"]}
    check_sources(cfg, recorded, "RUN")  # unchanged: fine
    check_sources(cfg, older, "RUN")
    write(GOOD + "\n# tuned\n")
    check_sources(cfg, recorded, "RUN")  # a comment: the run's reward all the same
    write(GOOD.replace("+ bonus", "+ 2 * bonus"))
    with pytest.raises(ResumeMismatchError, match="reward file") as err:
        check_sources(cfg, recorded, "RUN")
    assert "identity.reward.main_code_sha256" in str(err.value) and target in str(err.value)
    with pytest.raises(ResumeMismatchError, match="identity.reward.main_source_sha256"):
        check_sources(cfg, older, "RUN")


def test_kwargs_for_the_builtin_reward_are_refused():
    """The built-in reward is called without reward.kwargs: accepting them would change nothing, silently."""
    (p,) = reward_problems(_reward(kwargs={"tolerance": 0.5}))
    assert p.field == "reward.kwargs" and "built-in" in p.why
