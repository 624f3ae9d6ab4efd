"""The run directory: claimed with an exclusive lock for the life of the run, written atomically.

    ${output_root}/runs/<run_name>/
        run.lock            fcntl lock + the holder's pid/host (the kernel releases it if the holder dies)
        run_manifest.json   plan, identity, status (planned -> running -> completed | failed | interrupted | paused),
                            events

`claim(plan)` applies the resume policy:
    auto  - continue an existing run dir of the same identity (refuse another identity, with a diff)
    must  - refuse when there is nothing to resume
    never - refuse when the run already exists
"""

from __future__ import annotations

import copy
import datetime as dt
import fcntl
import json
import logging
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import FieldDiff, ResumeMismatchError, RunDirLocked, RunDirStateError
from harness import faults

MANIFEST = "run_manifest.json"
log = logging.getLogger("harness")
COMPLETION = "completion.json"  # written last, by harness.run.stages.finalize


def completion_kind(completion: dict) -> str:
    """The arm's kind a completion.json records (sft | rl); older ones by their budget fields."""
    return completion.get("kind") or ("rl" if "completion_token_ceiling" in completion else "sft")
LOCK = "run.lock"
STATUSES = ("planned", "running", "completed", "failed", "interrupted", "paused")  # the last two: harness.halt
MANIFEST_VERSION = 1


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


# --- atomic writes


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_UMASK = os.umask(0o022)
os.umask(_UMASK)


def naming(exc: OSError, path: str | os.PathLike) -> OSError:
    """`exc` with the file it failed on: a failed write() or fsync() names none."""
    return exc if exc.filename is not None else OSError(exc.errno, exc.strerror, str(path))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Temp file in the same dir, fsync, rename over `path`, fsync the dir: readers see old or new, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; the file is a plain shared artifact
        with os.fdopen(fd, "wb") as fh:
            if faults.armed():  # tests only (harness.faults): a crash or a full disk mid-write
                fh.write(data[: len(data) // 2])
                fh.flush()
                faults.point(f"atomic:{path.name}")
                data = data[len(data) // 2:]
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise naming(exc, path) from exc
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n").encode("utf-8"))


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


# --- the lock


def holder_info() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started_at": now()}


@dataclass
class RunDir:
    """A claimed run directory. Holds the lock until `release` (or process death)."""

    path: Path
    manifest: dict
    resumed: bool
    _fd: int | None = field(default=None, repr=False)
    writer: bool = True  # False on ranks > 0 of a multi-process launch: rank 0 writes the manifest

    @classmethod
    def follower(cls, path: Path, resumed: bool) -> "RunDir":
        """A rank > 0's view of the run dir that rank 0 claimed: no lock, never writes the manifest."""
        return cls(Path(path), read_json(Path(path) / MANIFEST), resumed=resumed, writer=False)

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def recorded(self, part: str) -> dict:
        """identity.<part> as this run recorded it (data, model: the content digests its stages bound it to)."""
        return self.manifest["identity"][part]

    def set_status(self, status: str, event: dict | None = None, **extra: Any) -> None:
        """`event`: fields of this status event (e.g. a planned stop's signal and step); `extra`: top-level fields.
        A planned stop's `halt` record is kept while the run is interrupted or paused, not after."""
        if status not in STATUSES:
            raise ValueError(f"unknown run status {status!r}; expected one of {STATUSES}")
        self.manifest["status"] = status
        self.manifest["updated_at"] = now()
        if status not in ("interrupted", "paused"):
            self.manifest.pop("halt", None)
        self.manifest.update(extra)
        self.manifest["events"].append({"status": status, "at": now(), **(event or {}), **holder_info()})
        if self.writer:
            atomic_write_json(self.manifest_path, self.manifest)

    def update(self, identity: dict | None = None, **fields: Any) -> None:
        """Record what a stage found: `identity` parts merged into the manifest's identity (e.g. {"data":
        {"content_sha256": ...}}), other fields set at the top level; saved at once (the writer)."""
        for part, values in (identity or {}).items():
            self.manifest["identity"].setdefault(part, {}).update(values)
        self.manifest.update(fields)
        self.manifest["updated_at"] = now()
        if self.writer:
            atomic_write_json(self.manifest_path, self.manifest)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def check_writable_dirs(dirs: dict[str, str], create: bool = True) -> None:
    """Every {field: directory} exists or is created now, and takes a file, checked before any work: a
    ConfigError naming the field, its value and the OS's reason instead of a traceback mid-run. `create=False`
    (mode=plan, which writes nothing): the same verdict from what exists, the nearest existing folder of each
    path being a directory this process may write into."""
    from harness.errors import ConfigError, Problem

    problems = []
    for key, value in dirs.items():
        path = Path(value).expanduser()
        try:
            if not create:
                _probe_without_writing(path)
                continue
            path.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".harness-write-probe-", dir=path)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
            where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
            why = f"{'it' if blocker == path else blocker} is a file, not a directory" if blocker is not None \
                else f"cannot be written: {exc.strerror or exc}{where}"
            problems.append(Problem(key, value, why,
                                    f"set {key} to a directory you can write (it is created when missing)"))
    if problems:
        raise ConfigError(problems)


def _probe_without_writing(path: Path) -> None:
    """Raise the OSError a mkdir + write under `path` would meet, without making either."""
    import errno

    nearest = next(p for p in (path, *path.parents) if p.exists())
    if not nearest.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(nearest))
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(nearest))


def lock_problem(content: bytes) -> str | None:
    """Why run.lock's content is not a holder record ({pid, host, started_at}); None when it is one (or empty:
    a crash between the truncate and the write of a claim)."""
    if not content.strip():
        return None
    try:
        holder = json.loads(content.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return f"holds {len(content)} bytes that are not a holder record (JSON with pid, host, started_at)"
    if not isinstance(holder, dict) or not {"pid", "host", "started_at"} <= set(holder):
        return "holds JSON that is not a holder record (pid, host, started_at)"
    return None


def acquire_lock(run_dir: Path) -> int:
    """Take the run dir's exclusive lock or raise RunDirLocked naming the live holder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = json.loads(os.pread(fd, 4096, 0).decode("utf-8") or "{}")
        except (ValueError, UnicodeDecodeError):
            holder = {}
        os.close(fd)
        raise RunDirLocked(str(run_dir), holder) from None
    why = lock_problem(os.pread(fd, 4096, 0))
    if why:
        log.warning("%s: %s; replaced (the lock itself was free)", run_dir / LOCK, why)
    payload = json.dumps(holder_info()).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, payload, 0)
    os.fsync(fd)
    return fd


# --- claim with the resume policy


def identity_diffs(recorded: dict, current: dict) -> list[FieldDiff]:
    """The identity fields that must match for a resume: semantic config, data, model, an arm's own (teacher), the
    reward functions' sources."""
    diffs = []
    for key in ("semantic_sha256",):
        if recorded.get(key) != current.get(key):
            diffs.append(FieldDiff(f"identity.{key}", recorded.get(key), current.get(key)))
    for part in ("data", "model", "teacher", "reward"):
        old, new = recorded.get(part) or {}, current.get(part) or {}
        for key in sorted(set(old) | set(new)):
            if key.endswith("sha256") and old.get(key) and new.get(key) and old[key] != new[key]:
                diffs.append(FieldDiff(f"identity.{part}.{key}", old[key], new[key]))
    return diffs


def config_diffs(old: Any, new: Any, prefix: str = "") -> list[FieldDiff]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += config_diffs(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [FieldDiff(prefix.rstrip("."), old, new)]


def mismatch_fix(path: Path, diffs: list[FieldDiff], manifest: dict) -> str:
    """The fix of a resume refused for `diffs`: restore what changed, or start the new run elsewhere (never another
    seed: that would change the experiment)."""
    new_run = f"for a new run, move {path} aside or set another output_root"
    edited = [d for d in diffs if d.field.startswith("identity.reward.")]
    if edited:  # rare since the run name carries the reward's code digest (an edit plans another dir): a run dir
        # reached with another reward all the same (a clash of the name's 8 hex digits, a manifest edited by hand)
        funcs = (manifest.get("identity", {}).get("reward") or {}).get("functions") or {}
        keys = [d.field.rsplit(".", 1)[1] for d in edited]  # <role>_code_sha256 (<role>_source_sha256: older runs)
        roles = [k[:-len(s)] for k in keys for s in ("_code_sha256", "_source_sha256") if k.endswith(s)]
        files = sorted({str((funcs.get(role) or {}).get("file")) for role in roles})  # code_sha256 (all): no role
        return (f"the reward function's code ({', '.join(files)}) is not the one this run trained with: restore it to "
                f"resume the run with the reward it trained with; {new_run} with the edited reward")
    return f"run the original command (same files) to resume this run; {new_run}"


def claim(plan, resume: str | None = None) -> RunDir:
    """Lock plan.run_dir, apply the resume policy, and write (or update) the manifest."""
    path = Path(plan.run_dir)
    policy = resume or plan.cfg.resume.value
    _check_policy(path, policy)  # refuse before creating anything
    created = not path.exists()
    fd = acquire_lock(path)
    try:
        _check_policy(path, policy)  # again, under the lock
        existed = (path / MANIFEST).exists()
        if existed:
            manifest = _read_manifest(path)
            diffs = identity_diffs(manifest.get("identity", {}), plan.identity)
            if diffs:
                raise ResumeMismatchError(str(path), diffs, mismatch_fix(path, diffs, manifest))
            if manifest.get("status") == "completed":  # nothing to do: leave every file as it is
                return RunDir(path, manifest, resumed=True, _fd=fd)
            changes = config_diffs(manifest["plan"]["config"], plan.config)
            if changes or manifest.get("identity", {}).get("code") != plan.identity.get("code"):
                manifest.setdefault("resumes", []).append({
                    "at": now(),
                    "config_changes": [d.__dict__ for d in changes],
                    "code": plan.identity.get("code"),
                    "config_sha256": plan.identity["config_sha256"],
                })
            run = RunDir(path, manifest, resumed=True, _fd=fd)
            atomic_write_json(run.manifest_path, manifest)
            remove_stale_temp_files(path)  # under the lock: no live writer owns them
            return run
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "run_name": plan.run_name,
            "status": "planned",
            "created_at": now(),
            "updated_at": now(),
            "identity": copy.deepcopy(plan.identity),  # completed by later stages (content digests)
            "plan": plan.to_json(),  # frozen as planned
            "parent": None,
            "events": [{"status": "planned", "at": now(), **holder_info()}],
        }
        atomic_write_json(path / MANIFEST, manifest)
        return RunDir(path, manifest, resumed=False, _fd=fd)
    except BaseException:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        if created and not (path / MANIFEST).exists():  # leave no empty run dir behind a refusal
            (path / LOCK).unlink(missing_ok=True)
            try:
                path.rmdir()
            except OSError:
                pass
        raise


def _read_manifest(path: Path) -> dict:
    try:
        manifest = read_json(path / MANIFEST)
        why = None if isinstance(manifest, dict) and isinstance(manifest.get("plan"), dict) else "not a run manifest"
    except (ValueError, UnicodeDecodeError) as exc:
        why = f"not valid JSON ({exc})"
    if why:
        raise RunDirStateError(
            f"{path / MANIFEST} is {why}: the run's identity and history cannot be read, so it cannot be resumed.\n"
            f"    fix: restore the file (`python -m harness.verify {path}` lists what else is damaged), or start a "
            "new run (another output_root)")
    return manifest


def remove_stale_temp_files(run_dir: Path) -> None:
    """Delete the temp files (.<name>.<random>.tmp) of atomic writes a dead process left half done: they never
    replaced their target, and verify reports them as torn writes."""
    stale = sorted(run_dir.rglob(".*.tmp"))
    for p in stale:
        p.unlink(missing_ok=True)
    if stale:
        log.info("removed %d temp file(s) of an interrupted write: %s", len(stale),
                 ", ".join(str(p.relative_to(run_dir)) for p in stale[:5]))


def _check_policy(path: Path, policy: str) -> None:
    existed = (path / MANIFEST).exists()
    if policy == "never" and existed:
        raise RunDirStateError(
            f"resume=never but run dir {path} already exists (status {_status_of(path)}).\n"
            "    fix: use resume=auto to continue it, another output_root, or remove the directory"
        )
    if policy == "must" and not existed:
        raise RunDirStateError(
            f"resume=must but there is nothing to resume at {path}.\n"
            "    fix: check output_root and the overrides (the run dir is derived from them), or use resume=auto"
        )


def _status_of(path: Path) -> str:
    try:
        return str(read_json(path / MANIFEST).get("status"))
    except (OSError, ValueError):
        return "unreadable"
