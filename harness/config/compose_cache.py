"""The compose cache: results of harness.config.compose.compose(argv) kept on disk, exact and strictly keyed.
Torch-free.

One Hydra compose of conf/config.yaml costs about twice `import hydra, omegaconf` (the defaults tree, the YAML
loads, the structured-config merges: ~20k deepcopy calls), and `mode=plan` of an RL arm composes twice (the run
and its SFT warm start). The result is a pure function of what the key below hashes, so a plan of a command
planned before skips Hydra entirely.

    key   sha256 over: FORMAT; sys.version; hydra and omegaconf versions; the installed Hydra plugins (names,
          sizes, mtime_ns of their .py files, not imported); the relative path and bytes of every file under the
          conf dir and sweeps/, and of every .py file under harness/config/ and arms/ (the ConfigStore's
          schemas, arm registry, warm-start variants and named sweeps come from there); the YAML of any derived
          ConfigStore option the argv names (`experiment=<name>__sft_warm_start`: stored by harness.plan at
          plan time, so its content, not its name, is what Hydra composes); the exact argv.
    value (cfg, choices) pickled (a DictConfig pickles with its structured types and flags), with the key
          inside, checked on load.
    where $HARNESS_CACHE_DIR/compose/, else $XDG_CACHE_HOME/harness/compose/, else ~/.cache/harness/compose/;
          HARNESS_COMPOSE_CACHE=0 turns it off.

Only successful composes are stored, and only after harness's strict check passed for the same argv (compose
calls `store` last), so an argv that fails composes again, and fails the same way, every time. The cache is a
convenience, never a dependency: any OSError or unreadable entry is a miss, a failed write is skipped. An entry
is a pickle, loaded only from the user's own cache dir (created 0700).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
import time
from pathlib import Path

FORMAT = 1  # bump when the entry's layout or the key's inputs change
MAX_ENTRIES = 256  # a write removes the least recently used beyond this (a hit refreshes an entry's mtime)
_STALE_TMP_S = 3600  # a temp file this old was left by a killed writer
_OFF = ("0", "false", "no", "off")


def enabled() -> bool:
    return os.environ.get("HARNESS_COMPOSE_CACHE", "1").strip().lower() not in _OFF


def cache_dir() -> Path | None:
    """Where entries live (compose/ of the user's harness cache); None when no home directory can be found (then
    nothing is cached)."""
    from harness.usercache import user_cache_dir

    root = user_cache_dir()
    return root / "compose" if root is not None else None


# --- the key


class _Hasher:
    """sha256 over length-prefixed parts, so that no two different sequences of parts hash alike."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def put(self, *parts) -> None:
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode()
            self._h.update(len(b).to_bytes(8, "little"))
            self._h.update(b)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _walk(root: Path, suffix: str = ""):
    """(relative posix path, DirEntry) of the files under root, in a fixed order; __pycache__ skipped."""
    stack = [(root, "")]
    while stack:
        d, rel = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        dirs = []
        for e in entries:
            if e.is_dir(follow_symlinks=True):
                if e.name != "__pycache__":
                    dirs.append((Path(e.path), f"{rel}{e.name}/"))
            elif e.name.endswith(suffix):
                yield f"{rel}{e.name}", e
        stack.extend(reversed(dirs))  # depth first, in name order


def _put_tree(h: _Hasher, label: str, root: Path, suffix: str = "") -> None:
    """Every file's relative path and content bytes (content, not mtime: a same-size edit is still a change)."""
    h.put("tree", label)
    for rel, e in _walk(root, suffix):
        with open(e.path, "rb") as f:
            h.put(rel, f.read())


def _put_plugins(h: _Hasher) -> None:
    """The installed Hydra plugins (they may add config sources or search paths): their .py files' names, sizes
    and mtime_ns; read from disk, never imported (importing them is what Hydra's own scan costs)."""
    mod = sys.modules.get("hydra_plugins")  # imported by a Hydra compose earlier in this process
    if mod is not None:
        dirs = list(getattr(mod, "__path__", []))
    else:  # found, not imported: a plan from the cache imports no plugin package at all
        import importlib.util

        try:
            spec = importlib.util.find_spec("hydra_plugins")
        except (ImportError, ValueError):
            spec = None
        dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    h.put("plugins", len(dirs))
    for d in sorted(str(p) for p in dirs):
        h.put("plugins", d)
        for rel, e in _walk(Path(d), ".py"):
            st = e.stat()
            h.put(rel, st.st_size, st.st_mtime_ns)


def _put_derived(h: _Hasher, argv: list[str]) -> None:
    """The ConfigStore content of each derived option the argv names (`experiment=comparison__sft_warm_start`):
    harness.plan stores it just before it composes, from conf/experiment/<name>.yaml and what the warm start
    drops (code outside harness/config), so its name alone does not say what Hydra would compose."""
    from harness.config.store import is_derived_option

    derived = [o for o in argv if "=" in o and is_derived_option(o.split("=", 1)[1])]
    if not derived:
        return
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    repo = ConfigStore.instance().repo
    for o in derived:
        group, value = o.split("=", 1)
        node = repo
        for part in [*group.lstrip("+~").split("@", 1)[0].split("/"), f"{value}.yaml"]:
            node = node.get(part) if isinstance(node, dict) else None
        h.put("derived", o)
        if node is None:
            h.put("absent")  # Hydra will fail on it: nothing is stored
        else:
            h.put(node.package, OmegaConf.to_yaml(node.node))


def compose_key(argv: list[str], conf_dir: Path, sweeps_dir: Path, code_dirs: dict[str, Path]) -> str:
    """The entry's name: what Hydra composes `argv` from, and how. Any change of any input is another key."""
    import hydra
    import omegaconf

    h = _Hasher()
    h.put("harness-compose", FORMAT, sys.version, hydra.__version__, omegaconf.__version__)
    _put_plugins(h)
    _put_tree(h, "conf", conf_dir)
    _put_tree(h, "sweeps", sweeps_dir)
    for label, root in sorted(code_dirs.items()):
        _put_tree(h, label, root, ".py")
    _put_derived(h, argv)
    h.put("argv", json.dumps(list(argv)))
    return h.hexdigest()


# --- entries


def load(key: str):
    """(cfg, choices) of the entry `key`, or None: absent, unreadable, not a valid entry, or another key's."""
    d = cache_dir()
    if d is None:
        return None
    path = d / f"{key}.pkl"
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f)
    except Exception:  # noqa: BLE001  (a missing, truncated or garbage file: pickle raises about anything)
        return None
    if not (isinstance(entry, dict) and entry.get("format") == FORMAT and entry.get("key") == key):
        return None
    cfg, choices = entry.get("cfg"), entry.get("choices")
    from omegaconf import DictConfig

    if not isinstance(cfg, DictConfig) or not isinstance(choices, dict):
        return None
    try:
        os.utime(path)  # recently used: the pruning below removes the least recently used first
    except OSError:
        pass
    return cfg, choices


def store(key: str, cfg, choices: dict) -> None:
    """Write the entry atomically (harness.rundir.atomic_write_bytes); any failure skips it."""
    from harness.rundir import atomic_write_bytes

    d = cache_dir()
    if d is None:
        return
    try:
        data = pickle.dumps({"format": FORMAT, "key": key, "cfg": cfg, "choices": dict(choices)},
                            protocol=pickle.HIGHEST_PROTOCOL)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_bytes(d / f"{key}.pkl", data)  # its temp file is removed on any failure but SIGKILL
        _prune(d)
    except Exception:  # noqa: BLE001  (read-only or full disk, an unpicklable value: the plan goes on uncached)
        pass


def _prune(d: Path) -> None:
    """At most MAX_ENTRIES entries: the oldest by mtime go first; temp files of killed writers go too."""
    entries, now = [], time.time()
    for e in os.scandir(d):
        try:
            mtime = e.stat().st_mtime
            if e.name.startswith(".") and e.name.endswith(".tmp"):  # atomic_write_bytes' temp file
                if now - mtime > _STALE_TMP_S:
                    os.unlink(e.path)
            elif e.name.endswith(".pkl"):
                entries.append((mtime, e.path))
        except OSError:  # removed meanwhile by another process
            continue
    entries.sort()
    for _, path in entries[:max(0, len(entries) - MAX_ENTRIES)]:
        try:
            os.unlink(path)
        except OSError:
            pass
