"""The harness's named exceptions. Each carries its data and renders as received -> expected -> why -> fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: which field, what value, why it is wrong, how to fix it."""

    field: str
    value: Any
    why: str
    fix: str

    def render(self) -> str:
        return f"{self.field} = {self.value!r}: {self.why}\n    fix: {self.fix}"


class HarnessError(Exception):
    """Base of the errors the CLI reports without a traceback."""

    exit_code = 1


class ConfigError(HarnessError):
    """Every problem found in a config, collected (never just the first)."""

    exit_code = 2

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        head = f"ConfigError: {n} problem{'s' if n != 1 else ''} in the configuration"
        return head + "\n" + "\n".join(f"  - {p.render()}" for p in self.problems)


class RunDirLocked(HarnessError):
    """Another live process holds the run directory's lock."""

    exit_code = 3

    def __init__(self, run_dir: str, holder: dict):
        self.run_dir, self.holder = run_dir, holder
        who = ", ".join(f"{k}={holder[k]}" for k in ("pid", "host", "started_at") if k in holder) or "unknown holder"
        super().__init__(
            f"run dir {run_dir} is held by another process ({who}).\n"
            "    fix: wait for it to finish, or stop that process; a killed holder releases the lock by itself."
        )


@dataclass
class FieldDiff:
    field: str
    expected: Any
    actual: Any


class ResumeMismatchError(HarnessError):
    """The run dir belongs to a different run identity (semantic config, data or model)."""

    exit_code = 4

    def __init__(self, run_dir: str, diffs: list[FieldDiff], fix: str):
        self.run_dir, self.diffs = run_dir, diffs
        lines = [f"  - {d.field}: run dir has {d.expected!r}, this command has {d.actual!r}" for d in diffs]
        super().__init__(
            f"ResumeMismatchError: {run_dir} was created by a different run:\n" + "\n".join(lines) + f"\n    fix: {fix}"
        )


class DataChangedError(ResumeMismatchError):
    """The dataset on disk is not the one the run trained on (exit 4, as any other identity mismatch)."""

    def __init__(self, run_dir: str, root: str, expected: str, actual: str, fix: str):
        self.run_dir, self.root = run_dir, root
        self.diffs = [FieldDiff("identity.data.content_sha256", expected, actual)]
        HarnessError.__init__(
            self,
            f"DataChangedError: the dataset at {root} is not the one {run_dir} trained on:\n"
            f"  - identity.data.content_sha256: the run trained on {expected!r}, the dataset on disk has {actual!r}\n"
            f"    fix: {fix}")


class RunDirStateError(HarnessError):
    """The run dir's state conflicts with the resume policy (resume=never on an existing run, must on none)."""

    exit_code = 5


@dataclass
class DataProblem:
    file: str
    line: int | None
    field: str | None
    why: str
    fix: str

    def render(self) -> str:
        where = self.file + (f":{self.line}" if self.line is not None else "")
        fld = f" [{self.field}]" if self.field else ""
        return f"{where}{fld}: {self.why}\n    fix: {self.fix}"


class DataContractError(HarnessError):
    """A dataset violates the contract of docs/data.md; every problem is listed."""

    exit_code = 2

    def __init__(self, root: str, problems: list[DataProblem]):
        self.root, self.problems = root, list(problems)
        n = len(self.problems)
        super().__init__(
            f"DataContractError: {n} problem{'s' if n != 1 else ''} in dataset {root}\n"
            + "\n".join(f"  - {p.render()}" for p in self.problems)
        )


class NonFiniteError(HarnessError):
    """More optimizer steps had a non-finite gradient than train.max_nonfinite_steps allows (none was applied)."""

    exit_code = 8


STORAGE_ERRNOS = {"ENOSPC": "the filesystem is full", "EDQUOT": "the disk quota is used up",
                  "EROFS": "the filesystem is read-only", "EACCES": "permission denied",
                  "EPERM": "operation not permitted", "EIO": "an I/O error", "ENOTDIR": "a path component is a file",
                  "EISDIR": "a directory is where a file goes",
                  "EEXIST": "a file is where a directory goes"}


class WarmStartError(HarnessError):
    """The SFT warm start did not teach the answer format: an RL run from it could not learn (exit 10)."""

    exit_code = 10


class StorageError(HarnessError):
    """A write of the run failed for the filesystem's reason (full, read-only, permission): exit 9. Every write of
    a run is atomic or bound to a checkpoint, so nothing half-written looks complete; the same command continues."""

    exit_code = 9

    def __init__(self, exc: OSError, dirs: dict[str, str]):
        import errno

        self.exc = exc
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        path = str(exc.filename or "")
        field, value = _owner(path, dirs)
        why = f"{path or 'a write'}: {exc.strerror or exc} [{name}]"
        other = f" (or set {field} to another directory)" if field != "path" else ""
        if name in ("ENOSPC", "EDQUOT"):
            fix = f"free space on that filesystem{other}"
        elif name in ("ENOTDIR", "EISDIR", "EEXIST"):
            fix = f"move away what is at that path: the run expects the other kind there{other}"
        elif name == "EIO":
            fix = f"check that disk (the kernel log says more){other}"
        else:
            fix = f"make that directory writable for this user{other}"
        fix += ", then run the same command (a started run continues from its newest complete checkpoint)"
        super().__init__(f"StorageError: {STORAGE_ERRNOS.get(name, name)}\n  - {Problem(field, value, why, fix).render()}")


def _owner(path: str, dirs: dict[str, str]) -> tuple[str, str]:
    """The config field whose directory holds `path` (the innermost one), or ("path", path)."""
    from pathlib import Path

    target = Path(path).expanduser().resolve()
    roots = {f: Path(d).expanduser().resolve() for f, d in dirs.items()}
    holders = sorted((len(r.parts), f) for f, r in roots.items() if target.is_relative_to(r))
    return (holders[-1][1], dirs[holders[-1][1]]) if path and holders else ("path", path)


def storage_error(exc: OSError, dirs: dict[str, str]) -> StorageError | None:
    """The StorageError of a filesystem OSError (full, read-only, permission, ...); None for any other OSError."""
    import errno

    return StorageError(exc, dirs) if errno.errorcode.get(exc.errno or 0) in STORAGE_ERRNOS else None
