"""A reward's identity: what a run records of its reward functions, what a resume and an eval compare, and the part
of the run name that carries it (harness.rewards.functions finds and calls the functions).

- `reward_identity`: each function's target, the sha256 of its source file (`source_sha256`) and of its parsed code
  (`code_sha256`: comments, blank lines and layout left out), and one digest over them, which the run name carries
  (`run_name_part`): an edited reward is a new run, a comment or a reformat the same run.
- `check_sources`: an eval (or a run about to load its rewards) refuses a reward whose code changed since the run
  recorded it.

Torch-free: the planner imports this module.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any, Mapping

from harness.errors import Problem
from harness.rewards.functions import BUILTIN, fn_refs, split_target


def file_digests(file: str | None) -> tuple[str | None, str | None]:
    """(source_sha256, code_sha256) of a file, from one read; (None, None) for no file or one that cannot be read."""
    if file is None:
        return None, None
    try:
        data = Path(file).read_bytes()
    except OSError:
        return None, None
    return hashlib.sha256(data).hexdigest(), _code_digest(data, file)


def source_sha256(file: str | None) -> str | None:
    """The sha256 of the file's bytes (recorded; runs planned before code_sha256 compared it)."""
    return file_digests(file)[0]


def _canonical(node: Any) -> str:
    """An AST as text, without line numbers, and without the fields that are None or empty (not ast.dump, whose text
    changes when a Python release adds such a field, e.g. 3.12's type_params=[]): one code, one text across releases."""
    if isinstance(node, ast.AST):
        fields = [f"{k}={_canonical(v)}" for k, v in ast.iter_fields(node) if v is not None and v != []]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(_canonical(x) for x in node)}]"
    return repr(node)


def code_sha256(file: str | None) -> str | None:
    """The sha256 of the file's code as Python parses it: comments, blank lines and layout (spacing, line breaks, the
    quotes of a string) are left out; every statement, name, constant and docstring is in. The identity compares it
    and the run name carries it: a comment or a reformat of a reward is the same run, any edit that could change
    what it computes is another. A file that does not parse as Python (an extension module) is digested as bytes."""
    return file_digests(file)[1]


def _code_digest(data: bytes, file: str) -> str:
    try:
        tree = ast.parse(data, filename=file)  # bytes: a coding declaration decodes the literals, as at import
    except (SyntaxError, ValueError):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha256(("python-ast:" + _canonical(tree)).encode("utf-8")).hexdigest()


COMPARED = "_code_sha256"  # identity.reward.<role>_code_sha256: what a resume compares and the run name carries


def reward_identity(reward: Mapping[str, Any]) -> dict:
    """identity.reward: each function's target, the sha256 of its source file (source_sha256) and of its parsed code
    (code_sha256, also as `<role>_code_sha256`), and `code_sha256`, one sha256 over those, which the run name
    carries; a resume compares them all. The built-in's source is the harness code (identity.code), not repeated
    here. The scope is each target's own file: a helper module it imports is not in it."""
    refs = fn_refs(reward)
    out: dict[str, Any] = {"functions": {}}
    seen: dict[str, tuple[str | None, str | None]] = {}
    for ref in refs:
        if isinstance(ref, Problem):  # the plan refused it already; nothing to identify
            continue
        if ref.builtin:
            sha = code = None
        else:  # main and components often share one file: read and parsed once
            if ref.file not in seen:
                seen[ref.file] = file_digests(ref.file)
            sha, code = seen[ref.file]
        out["functions"][ref.role] = {"target": ref.target, "convention": ref.convention,
                                      "file": None if ref.builtin else ref.file, "source_sha256": sha,
                                      "code_sha256": code}
        if code:
            out[f"{ref.role}{COMPARED}"] = code
    digests = [f"{k}={v}" for k, v in sorted(out.items()) if k.endswith(COMPARED)]
    if digests:  # the reward's own digest, over every function's: the run name carries it (run_name_part)
        out["code_sha256"] = hashlib.sha256("\n".join(digests).encode()).hexdigest()
    return out


def run_name_part(identity: Mapping[str, Any] | None, hash_len: int) -> str | None:
    """The run name's reward part, `<main function's name>_<identity.reward.code_sha256[:hash_len]>`: an edited
    reward file (main or component) is a new run, not a resume conflict. None when every function is the built-in
    (its source is the harness code: run names stay as they were) and for an arm without a reward (SFT: its identity
    has none, so one warm start serves every reward)."""
    digest = (identity or {}).get("code_sha256")
    if not digest:
        return None
    parts = split_target((((identity or {}).get("functions") or {}).get("main") or {}).get("target") or BUILTIN)
    return f"{parts[2] if isinstance(parts, tuple) else 'reward'}_{digest[:hash_len]}"


def source_digests(reward: Mapping[str, Any]) -> dict[str, str]:
    """{<role>_code_sha256: digest} of the reward's functions (identity.reward's compared part)."""
    return {k: v for k, v in reward_identity(reward).items() if k.endswith(COMPARED)}


def check_sources(reward: Mapping[str, Any], recorded: Mapping[str, Any] | None, run_dir: str) -> None:
    """Refuse to score a run's policy with a reward whose code changed since the run recorded it (identity.reward):
    an eval with another reward would not be the run's. A function is unchanged when its parsed code is (a comment
    edit is fine) or its file's bytes are (the digest a run planned before code_sha256 recorded)."""
    from harness.errors import FieldDiff, ResumeMismatchError

    recorded = recorded or {}
    now = reward_identity(reward)
    then_fns, now_fns = recorded.get("functions") or {}, now["functions"]
    diffs, files = [], []
    for key, then in sorted(recorded.items()):
        suffix = next((s for s in (COMPARED, "_source_sha256") if key.endswith(s)), None)
        if suffix is None or not then:
            continue
        role = key[:-len(suffix)]
        same_bytes = (then_fns.get(role) or {}).get("source_sha256") if suffix == COMPARED else then
        current = now_fns.get(role) or {}
        if then == now.get(key) or (same_bytes and same_bytes == current.get("source_sha256")):
            continue
        diffs.append(FieldDiff(f"identity.reward.{key}", then, now.get(key, current.get("source_sha256"))))
        files.append(str(current.get("file")))
    if diffs:
        raise ResumeMismatchError(run_dir, diffs, f"the reward file ({', '.join(files)}) changed since this run used "
                                  "it: restore it (e.g. from version control) to score with the run's reward; the "
                                  "training command trains the edited reward as a run of its own (its run name "
                                  "carries the reward's code digest)")
