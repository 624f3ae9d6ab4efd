"""The invariants harness.verify checks against completion.json (harness.run.stages.finalize writes it, last).
Torch-free.

For an RL run: the sum of ledger tokens equals realized_completion_tokens <= completion_token_ceiling;
ledger completion ids are unique; trace rows match ledger rows one to one; there is at least one
published checkpoint and every checkpoint's files match their digests; the logs are what the checkpoints'
frontiers bound (nothing edited in a retained segment, nothing appended after the final checkpoint);
final_policy/ matches its manifest; the eval artifacts named exist. For SFT: the loss tokens counted up
front equal the loss tokens the trainer actually trained on, and never exceed the cap.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from harness.accounting.logs import METRICS_PATH, Frontier, FrontierError, check_frontier, read_rows
from harness.accounting.checkpoint import CHECKPOINT_MANIFEST, checkpoint_problems, complete_checkpoints, list_checkpoints
from harness.eval import artifact_name, artifact_path, periodic_evals
from harness.identity import sha256_file
from harness.rundir import COMPLETION, completion_kind, read_json



# --- verify checks (registered in harness.verify)


def check_completion_accounting(run_dir: Path, m: dict) -> list[str]:
    if m.get("status") != "completed" or not (run_dir / COMPLETION).is_file():
        return []
    comp = read_json(run_dir / COMPLETION)
    out = []
    if comp.get("identity", {}).get("semantic_sha256") != m.get("identity", {}).get("semantic_sha256"):
        out.append(f"{COMPLETION}: identity differs from the manifest's")
    if completion_kind(comp) == "rl":
        ledgers = sorted((run_dir / "ledgers").glob("rank-*.jsonl"))
        lrows, trows = [], []
        for lp in ledgers:
            lrows += list(read_rows(lp))
            tp = run_dir / "traces" / lp.name
            trows += list(read_rows(tp)) if tp.exists() else []
        ids = [r["completion_id"] for r in lrows]
        tokens = sum(r["tokens"] for r in lrows)
        if tokens != comp["realized_completion_tokens"]:
            out.append(f"ledger tokens sum to {tokens}, completion.json says {comp['realized_completion_tokens']}")
        if tokens > comp["completion_token_ceiling"]:
            out.append(f"realized {tokens} tokens > ceiling {comp['completion_token_ceiling']}")
        if len(ids) != comp["realized_completion_count"]:
            out.append(f"ledger has {len(ids)} rows, completion.json says {comp['realized_completion_count']}")
        dup = [k for k, n in Counter(ids).items() if n > 1]
        if dup:
            out.append(f"{len(dup)} duplicate completion ids in the ledgers, e.g. {dup[0]}")
        if [r["completion_id"] for r in trows] != ids:
            out.append(f"trace rows ({len(trows)}) do not match ledger rows ({len(ids)}) one to one")
        for rk in comp.get("ranks") or []:  # each rank's own count against its own ledger
            lp = run_dir / "ledgers" / f"rank-{rk['rank']}.jsonl"
            got = sum(r["tokens"] for r in read_rows(lp)) if lp.exists() else 0
            if got != rk["completion_tokens"]:
                out.append(f"ledgers/rank-{rk['rank']}.jsonl sums to {got} tokens, rank {rk['rank']} counted "
                           f"{rk['completion_tokens']}")
        if comp.get("world_size", 1) != len(ledgers):
            out.append(f"{len(ledgers)} rank ledger(s) for world size {comp.get('world_size', 1)}")
    elif "realized_loss_tokens" in comp:
        if comp["realized_loss_tokens"] != comp["planned_loss_tokens"]:
            out.append(f"SFT trained on {comp['realized_loss_tokens']} loss tokens, the cap planned "
                       f"{comp['planned_loss_tokens']}")
        if comp["realized_loss_tokens"] > comp["loss_token_ceiling"]:
            out.append(f"SFT loss tokens {comp['realized_loss_tokens']} > ceiling {comp['loss_token_ceiling']}")
    return out


def check_checkpoints(run_dir: Path, m: dict) -> list[str]:
    out = []
    for p in list_checkpoints(run_dir):
        out += checkpoint_problems(p, identity=m.get("identity") or {})
    for p in complete_checkpoints(run_dir):  # data parallel: every rank holds the same weights and optimizer
        ranks = read_json(p / CHECKPOINT_MANIFEST).get("state_digests") or {}
        for part in ("params", "adapters", "optimizer"):
            seen = {(d or {}).get(part) for d in ranks.values()}
            if len(seen) > 1:
                out.append(f"{p.name}: the ranks' {part} digests differ ({len(seen)} distinct): the replicas diverged")
    if m.get("status") == "completed" and not complete_checkpoints(run_dir):
        out.append("status is completed but no checkpoint was published")
    return out


def check_final_policy(run_dir: Path, m: dict) -> list[str]:
    if m.get("status") != "completed":
        return []
    fp = run_dir / "final_policy"
    mp = fp / "harness_policy.json"
    if not mp.is_file():
        return ["final_policy/harness_policy.json is missing"]
    out = []
    manifest = read_json(mp)
    for rel, meta in manifest["files"].items():
        p = fp / rel
        if not p.is_file() or sha256_file(p) != meta["sha256"]:
            out.append(f"final_policy/{rel}: missing or its sha256 differs from harness_policy.json")
    if manifest.get("card", "final") != "final":  # (runs from before the card have no `card`)
        out.append(f"final_policy/README.md is the {manifest['card']} model card of a completed run (harness.card)")
    return out


def check_metrics(run_dir: Path, m: dict) -> list[str]:
    p = run_dir / METRICS_PATH
    if not p.exists():
        return []
    steps = [r.get("step") for r in read_rows(p)]
    dup = [s for s, n in Counter(steps).items() if n > 1]
    return [f"metrics.jsonl has duplicate rows for steps {dup[:5]}"] if dup else []


def check_evals(run_dir: Path, m: dict) -> list[str]:
    out = []
    ident = m.get("identity") or {}
    # the run's own configs: as planned, and as resumed with non-semantic changes (a pause, another logger)
    own = {"config_sha256": {ident.get("config_sha256"), *(r.get("config_sha256") for r in m.get("resumes", []))},
           "semantic_sha256": {ident.get("semantic_sha256")}}
    for p in sorted((run_dir / "eval").glob("*.json")) if (run_dir / "eval").is_dir() else []:
        try:
            got = read_json(p).get("identity") or {}
        except (OSError, ValueError) as exc:
            out.append(f"eval/{p.name}: unreadable ({exc})")
            continue
        for key in ("config_sha256", "semantic_sha256"):
            if got.get(key) not in own[key]:
                out.append(f"eval/{p.name}: identity.{key} is not this run's (an artifact of another run?)")
    if m.get("status") != "completed" or not (run_dir / COMPLETION).is_file():
        return out
    comp = read_json(run_dir / COMPLETION)
    for key, label in (("eval_before", "before"), ("eval_after", "final")):
        ev = comp.get(key)
        if ev and not artifact_path(run_dir, ev["split"], label).is_file():
            out.append(f"{key} is recorded but eval/{artifact_name(ev['split'], label)}.json is missing")
    return out


def check_log_frontiers(run_dir: Path, m: dict) -> list[str]:
    """Every retained checkpoint's frontiers still hold; a completed run's logs end exactly at the frontier its
    final (latest complete) checkpoint bound (an unfinished run's rows past its newest checkpoint are the ones
    the next start rolls back).

    For every log a retained checkpoint binds (each rank's ledger and trace, rank 0's metrics): the bytes
    of the frontier's segment still hash to the recorded chain (`check_frontier`), and, for the latest
    checkpoint, the file ends at the frontier: a row appended after the final checkpoint was never bound
    to one, so no checkpoint accounts for it (the trainer writes nothing to the logs after its final save;
    its end-of-training summary goes to completion.json, not metrics.jsonl).

    Caveat: check_frontier re-hashes only a frontier's last segment (segment_start..offset), and retention
    deletes older checkpoints, so only the union of the retained checkpoints' segments is covered. An edit
    before the oldest retained segment (e.g. to a ledger's first rows) is caught only by the other checks
    (token sums and counts against completion.json, unique ids, trace/ledger one to one).
    """
    ckpts = complete_checkpoints(run_dir)
    out = []
    for i, p in enumerate(ckpts):
        try:
            ranks = read_json(p / CHECKPOINT_MANIFEST).get("frontier") or {}
        except (OSError, ValueError):
            continue  # check_checkpoints reports the unreadable manifest
        final = i == len(ckpts) - 1
        for logs in ranks.values():
            for kind, fj in logs.items():
                try:
                    f = Frontier.from_json(fj)
                except TypeError:
                    out.append(f"{p.name}/{CHECKPOINT_MANIFEST}: malformed {kind} frontier {fj!r}")
                    continue
                try:
                    check_frontier(run_dir, f)
                except FrontierError as exc:
                    out.append(f"{str(exc).replace('the checkpoint', p.name)} (edited after it was bound?); fix: "
                               f"restore the original {f.path}, or rerun the job into a new output_root")
                    continue
                size = (run_dir / f.path).stat().st_size
                if final and size > f.offset and m.get("status") == "completed":  # (unfinished: rolled back)
                    out.append(f"{f.path}: {size} bytes, past the final {p.name}'s frontier at {f.offset} bytes "
                               f"({f.rows} rows): rows appended after the final checkpoint are unaccounted; fix: "
                               f"truncate {f.path} to {f.offset} bytes, or rerun the job into a new output_root")
    return out


def check_periodic_evals(run_dir: Path, m: dict) -> list[str]:
    """train.eval_steps: each periodic eval artifact (eval/<split>-checkpoint-N.json with a `step`) scored the
    weights of its kept checkpoint-N (same digest), and its accuracy is the one metrics.jsonl holds at step N. Only
    for a completed run: an unfinished one may hold an eval of a step whose checkpoint the next start redoes."""
    from harness.accounting.weights import weights_digest

    if m.get("status") != "completed" or not (run_dir / "eval").is_dir():
        return []
    logged = {r.get("step"): r for r in read_rows(run_dir / METRICS_PATH)} if (run_dir / METRICS_PATH).is_file() else {}
    out = []
    split = (((m.get("plan") or {}).get("config") or {}).get("data") or {}).get("eval_split", "test")
    for res in periodic_evals(run_dir, split):
        name, ckpt = res["artifact"], run_dir / "checkpoints" / str(res.get("checkpoint"))
        if not (ckpt / CHECKPOINT_MANIFEST).is_file():
            out.append(f"eval/{name}: its checkpoint {res.get('checkpoint')} is gone (a periodic eval's checkpoint "
                       "is kept)")
        elif weights_digest(ckpt) != res.get("policy_sha256"):
            out.append(f"eval/{name}: policy_sha256 is not the weights digest of {ckpt.name}")
        row = logged.get(res["step"]) or {}
        if row.get("eval_accuracy") != res.get("accuracy"):
            out.append(f"eval/{name}: accuracy {res.get('accuracy')} but metrics.jsonl has eval_accuracy "
                       f"{row.get('eval_accuracy')} at step {res['step']}")
    return out


def check_policy_ages(run_dir: Path, m: dict) -> list[str]:
    """rollout=async: every ledger row names the policy version that sampled it, its age (round minus version) is
    the lag's, or free running (rollout.lag null) from 0 to rollout.max_policy_age, and its trace row says the
    same."""
    rollout = ((m.get("plan") or {}).get("config") or {}).get("rollout") or {}
    if rollout.get("mode") != "async":
        return []
    lag, cap, out = rollout.get("lag"), rollout.get("max_policy_age"), []
    cycle = ((m.get("plan") or {}).get("budget", {}).get("generation_round") or {}).get("optimizer_steps") or 1
    for lp in sorted((run_dir / "ledgers").glob("rank-*.jsonl")):
        tp = run_dir / "traces" / lp.name
        traced = {r["completion_id"]: r for r in read_rows(tp)} if tp.exists() else {}
        for r in read_rows(lp):
            cid, version, age = r["completion_id"], r.get("policy_version"), r.get("policy_age")
            if version is None or age is None:
                out.append(f"{lp.name}: {cid} names no policy version (rollout=async samples every round from one)")
                break
            rnd = r["step"] // cycle
            if age != rnd - version or not 0 <= age <= cap or (lag is not None and age != min(rnd, lag)):
                out.append(f"{lp.name}: {cid} trained at round {rnd} was sampled by version {version} (age {age}); "
                           f"rollout.lag={lag}, rollout.max_policy_age={cap}")
                break
            t = traced.get(cid)
            if t is not None and (t.get("policy_version"), t.get("policy_age")) != (version, age):
                out.append(f"{tp.name}: {cid} says version {t.get('policy_version')}, its ledger row {version}")
                break
    return out


CHECKS = [check_completion_accounting, check_checkpoints, check_log_frontiers, check_final_policy, check_metrics,
          check_evals, check_periodic_evals, check_policy_ages]
