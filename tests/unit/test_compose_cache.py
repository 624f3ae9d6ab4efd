"""The compose cache (harness/config/compose_cache.py, issue 15): a cached compose is the uncached one in every
respect the plan and the strict check read; a hit skips Hydra; any change of a conf file's content, of the argv,
of a schema file, of a plugin or version, or of a derived warm-start option is a miss; errors are never stored;
a broken cache dir or entry is a miss; HARNESS_COMPOSE_CACHE=0 writes nothing. Torch-free."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from harness.config import compose as C
from harness.config import compose_cache
from harness.errors import ConfigError
from tests.conftest import run_harness

ARGVS = [[], ["arm=papo", "seed=3"], ["experiment=comparison", "arm=evi_po"], ["debug=tiny", "arm=sft"],
         ["model=tiny_lm", "arm=grpo"]]
IDENTITY = {"code": {"fixed": True}, "environment": {"fixed": True}}  # no git reads: the tree may change meanwhile


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The compose cache on, in a dir of this test only; returns the dir entries go to."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HARNESS_COMPOSE_CACHE", raising=False)
    return tmp_path / "cache" / "compose"


def _entries(d) -> list[str]:
    return sorted(p.name for p in d.glob("*.pkl")) if d.is_dir() else []


def _nodes(node, path: str = "") -> dict:
    """Every node of a config: its class, structured type, declared type, optional, key and element types, its
    own flags and the effective struct / readonly flags (what OmegaConf.to_object, get_type and strict_check read)."""
    m = node._metadata
    out = {path: (type(node).__name__, m.object_type, m.ref_type, m.optional, getattr(m, "key_type", None),
                  getattr(m, "element_type", None),
                  dict(m.flags or {}), node._get_flag("struct"), node._get_flag("readonly"),
                  OmegaConf.get_type(node) if isinstance(node, (DictConfig, ListConfig)) else None)}
    if isinstance(node, DictConfig) and not node._is_none() and not node._is_missing():
        for k in node.keys():
            out.update(_nodes(node._get_node(k), f"{path}.{k}"))
    elif isinstance(node, ListConfig) and not node._is_none() and not node._is_missing():
        for i in range(len(node)):
            out.update(_nodes(node._get_node(i), f"{path}[{i}]"))
    else:
        out[path] += (type(node._value()).__name__,)
    return out


def _plan(cfg, choices, argv) -> dict:
    from harness.plan import build_plan

    return build_plan(cfg, choices, argv, process_identity=IDENTITY).to_json()


def _no_hydra(mp: pytest.MonkeyPatch) -> None:
    """Hydra's compose, its initialization, the ConfigStore registration and the strict check all raise."""
    import hydra

    import harness.config.overrides as ov

    def boom(*a, **k):
        raise AssertionError("a cache hit must not compose with Hydra")

    mp.setattr(hydra, "compose", boom)
    mp.setattr(hydra, "initialize_config_dir", boom)
    mp.setattr(C, "ensure_registered", boom)
    mp.setattr(ov, "strict_check", boom)


# --- (1) cached == uncached


@pytest.mark.parametrize("args", ARGVS, ids=lambda a: " ".join(a) or "default")
def test_cached_compose_equals_uncached_in_every_respect(args, cache, tmp_path, monkeypatch):
    argv = [f"output_root={tmp_path / 'out'}", *args]
    monkeypatch.setenv("HARNESS_COMPOSE_CACHE", "0")
    cold_cfg, cold_choices = C.compose(argv)
    cold_plan = _plan(cold_cfg, cold_choices, argv)
    assert _entries(cache) == []
    monkeypatch.delenv("HARNESS_COMPOSE_CACHE")
    C.compose(argv)  # the miss that stores it
    assert len(_entries(cache)) == 1
    with pytest.MonkeyPatch.context() as mp:
        _no_hydra(mp)
        cfg, choices = C.compose(argv)  # unpickled from the entry
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(cold_cfg)
    assert choices == cold_choices
    assert _nodes(cfg) == _nodes(cold_cfg)
    assert OmegaConf.get_type(cfg) is OmegaConf.get_type(cold_cfg)
    assert _plan(cfg, choices, argv) == cold_plan  # an RL arm's warm start: composed (a miss), then a hit below
    assert _plan(*C.compose(argv), argv) == cold_plan


def test_mode_plan_twice_prints_the_same_plan_and_caches_run_and_warm_start(tmp_path):
    """The CLI end to end: a plan of an RL arm stores two entries (the run, its SFT warm start); planning it again
    and planning it uncached print the same JSON."""
    env = {"HARNESS_CACHE_DIR": str(tmp_path / "cache"), "HARNESS_COMPOSE_CACHE": None}
    args = ("mode=plan", f"output_root={tmp_path / 'out'}", "arm=papo")
    first, second = run_harness(*args, env=env), run_harness(*args, env=env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr[-2000:] + second.stderr[-2000:]
    assert len(_entries(tmp_path / "cache" / "compose")) == 2
    off = run_harness(*args, env={**env, "HARNESS_COMPOSE_CACHE": "0"})
    assert json.loads(first.stdout) == json.loads(second.stdout) == json.loads(off.stdout)
    assert json.loads(second.stdout)["parent"]["kind"] == "sft"
    assert not (tmp_path / "out").exists()  # mode=plan writes nothing in output_root


def test_a_cached_plan_registers_no_schemas(tmp_path):
    """The CLI's cached path: no ConfigStore registration (~20-40 ms) and no second strict check, which would
    register it (harness.cli registers lazily; compose's entry was stored after its strict check)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import sys; from harness import cli; from hydra.core.config_store import ConfigStore\n"
            f"sys.argv = ['harness', 'mode=plan', 'output_root={tmp_path / 'out'}']; cli.main()\n"
            "print('registered', 'base_config.yaml' in ConfigStore.instance().repo)")
    env = {**os.environ, "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("HARNESS_COMPOSE_CACHE", None)
    runs = [subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    assert [r.stdout.splitlines()[-1] for r in runs] == ["registered True", "registered False"]


# --- (2) a hit skips Hydra


def test_a_hit_skips_hydra_and_the_strict_check(cache, monkeypatch):
    argv = ["arm=evi_po", "arm.lambda_direction=0.25"]
    cold = C.compose(argv)
    _no_hydra(monkeypatch)
    cfg, choices = C.compose(argv)
    assert cfg.arm.lambda_direction == 0.25 and choices == cold[1]
    with pytest.raises(AssertionError, match="must not compose"):  # the guard works: a miss does reach Hydra
        C.compose(["arm=evi_po", "arm.lambda_direction=0.5"])


def test_inside_a_hydra_app_nothing_is_cached(cache):
    from hydra import initialize_config_dir

    C.ensure_registered()
    with initialize_config_dir(config_dir=C.CONF_DIR, version_base="1.3", job_name="harness"):
        cfg, _ = C.compose(["seed=5"])
    assert cfg.seed == 5 and _entries(cache) == []


# --- (3) what the key covers


def test_a_conf_edit_of_the_same_size_and_mtime_is_a_miss(cache, tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(C.CONF_DIR, conf)
    monkeypatch.setattr(C, "CONF_DIR", str(conf))
    cfg, _ = C.compose([])
    assert cfg.arm.learning_rate == 1.0e-4 and len(_entries(cache)) == 1
    C.compose([])
    assert len(_entries(cache)) == 1  # a hit: nothing new
    path = conf / "arm" / "grpo.yaml"
    st, text = path.stat(), path.read_text()
    assert "learning_rate: 1.0e-4" in text
    path.write_text(text.replace("learning_rate: 1.0e-4", "learning_rate: 2.0e-4"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # content only: the same size, the same mtime
    assert path.stat().st_size == st.st_size
    cfg, _ = C.compose([])
    assert cfg.arm.learning_rate == 2.0e-4 and len(_entries(cache)) == 2


def test_each_argv_has_its_own_entry(cache):
    assert C.compose(["seed=1"])[0].seed == 1
    assert C.compose(["seed=2"])[0].seed == 2
    assert C.compose(["seed=1"])[0].seed == 1
    assert C.compose(["seed=1", "arm=papo"])[1]["arm"] == "papo"
    assert C.compose(["arm=papo", "seed=1"])[1]["arm"] == "papo"  # the exact argv: its order too
    assert len(_entries(cache)) == 4


def test_a_derived_warm_start_option_is_keyed_by_its_content(cache):
    """`experiment=<name>__sft_warm_start` is stored by the plan from code outside harness/config: the same
    name with other content (here: train.eval_steps dropped or not) must not hit the other's entry."""
    from harness.config.store import warm_start_experiment

    option = warm_start_experiment("comparison", lambda key: key.startswith("arm"))
    assert C.compose([f"experiment={option}"])[0].train.eval_steps == 100
    assert warm_start_experiment("comparison", lambda key: key.startswith(("arm", "train"))) == option
    cfg, _ = C.compose([f"experiment={option}"])
    assert cfg.train.eval_steps != 100 and len(_entries(cache)) == 2


def _key(argv, conf, sweeps, code):
    return compose_cache.compose_key(argv, conf, sweeps, code)


def test_the_key_covers_code_plugins_versions_sweeps_and_argv(tmp_path, monkeypatch):
    import hydra
    import hydra_plugins

    conf, sweeps, code, plugins = (tmp_path / n for n in ("conf", "sweeps", "code", "plugins"))
    for d in (conf, sweeps, code, plugins / "hydra_x"):
        d.mkdir(parents=True)
    (conf / "config.yaml").write_text("seed: 0\n")
    (sweeps / "s.yaml").write_text("a: 1\n")
    (code / "schema.py").write_text("X = 1\n")
    (plugins / "hydra_x" / "p.py").write_text("P = 1\n")
    monkeypatch.setattr(hydra_plugins, "__path__", [str(plugins)])
    base = _key([], conf, sweeps, {"code": code})
    assert _key([], conf, sweeps, {"code": code}) == base  # deterministic
    (code / "notes.txt").write_text("not code")
    assert _key([], conf, sweeps, {"code": code}) == base  # only .py files of the code dirs

    def changed(edit) -> bool:
        edit()
        return _key([], conf, sweeps, {"code": code}) != base

    assert _key(["seed=1"], conf, sweeps, {"code": code}) != base
    assert changed(lambda: (code / "schema.py").write_text("X = 2\n"))
    (code / "schema.py").write_text("X = 1\n")
    assert changed(lambda: (sweeps / "s.yaml").write_text("a: 2\n"))
    (sweeps / "s.yaml").write_text("a: 1\n")
    assert changed(lambda: (conf / "extra.yaml").write_text(""))  # a new file, even empty
    (conf / "extra.yaml").unlink()
    assert changed(lambda: (plugins / "hydra_x" / "q.py").write_text(""))  # a plugin installed
    (plugins / "hydra_x" / "q.py").unlink()
    assert changed(lambda: monkeypatch.setattr(hydra, "__version__", "0.0.0"))


def test_compose_keys_the_schema_code_arms_and_sweeps_it_composes_from(tmp_path, monkeypatch):
    """The wiring: compose's key reads harness/config/*.py, arms/**/*.py and the sweeps dir of register()."""
    import harness.config.store as store

    dirs = {"_CONFIG_CODE_DIR": tmp_path / "config", "ARMS_DIR": tmp_path / "arms"}
    for attr, d in dirs.items():
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "m.py").write_text("A = 1\n")
        monkeypatch.setattr(C, attr, d)
    sweeps = tmp_path / "sweeps"
    shutil.copytree(store.SWEEPS_DIR, sweeps)
    monkeypatch.setattr(store, "SWEEPS_DIR", sweeps)
    base = C._cache_key([])
    for d in dirs.values():
        (d / "sub" / "m.py").write_text("A = 2\n")
        assert C._cache_key([]) != base, d
        (d / "sub" / "m.py").write_text("A = 1\n")
    assert C._cache_key([]) == base
    (sweeps / "new.yaml").write_text("hydra: {}\n")
    assert C._cache_key([]) != base


# --- (4) errors are never cached


@pytest.mark.parametrize("argv", [["arm=grppo"], ["+arm.lamda_direction=0.5", "arm=evi_po"]],
                         ids=["hydra error", "strict-check error"])
def test_errors_are_not_cached(argv, cache):
    messages = []
    for _ in range(2):
        with pytest.raises(ConfigError) as exc:
            C.compose(argv)
        messages.append(str(exc.value))
    assert messages[0] == messages[1] and "fix:" in messages[0]
    assert _entries(cache) == []


# --- (5) a broken cache is a miss


def test_a_garbage_or_foreign_entry_is_a_miss(cache):
    good = C.compose(["seed=7"])
    (entry,) = cache.glob("*.pkl")
    entry.write_bytes(b"\x80\x05garbage")
    cfg, choices = C.compose(["seed=7"])
    assert cfg.seed == 7 and choices == good[1]
    C.compose(["seed=8"])
    other = next(p for p in cache.glob("*.pkl") if p != entry)
    shutil.copyfile(other, entry)  # a valid entry of another key under this key's name: the key inside says so
    assert C.compose(["seed=7"])[0].seed == 7


def test_an_unwritable_cache_dir_is_a_miss(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(blocker))  # <file>/compose can be neither read nor created
    monkeypatch.delenv("HARNESS_COMPOSE_CACHE", raising=False)
    assert C.compose(["seed=9"])[0].seed == 9
    assert C.compose(["seed=9"])[0].seed == 9


def test_the_least_recently_used_entries_go_beyond_the_limit(cache, monkeypatch):
    monkeypatch.setattr(compose_cache, "MAX_ENTRIES", 2)
    C.compose(["seed=1"])
    C.compose(["seed=2"])
    keys = {s: C._cache_key([f"seed={s}"]) for s in (1, 2, 3)}
    oldest, newer = sorted((1, 2), key=lambda s: keys[s], reverse=True)  # the oldest by mtime, not by name
    os.utime(cache / f"{keys[oldest]}.pkl", (1_000, 1_000))
    os.utime(cache / f"{keys[newer]}.pkl", (2_000, 2_000))
    C.compose(["seed=3"])
    assert _entries(cache) == sorted(f"{keys[s]}.pkl" for s in (newer, 3))
    os.utime(cache / f"{keys[3]}.pkl", (500, 500))
    C.compose(["seed=3"])  # a hit makes it the most recently used
    assert (cache / f"{keys[3]}.pkl").stat().st_mtime > 2_000


# --- (6) off


def test_off_never_writes_nor_reads(cache, monkeypatch):
    C.compose(["seed=4"])
    assert len(_entries(cache)) == 1
    monkeypatch.setenv("HARNESS_COMPOSE_CACHE", "0")
    monkeypatch.setattr(compose_cache, "load", lambda key: pytest.fail("read with the cache off"))
    shutil.rmtree(cache)
    assert C.compose(["seed=4"])[0].seed == 4
    assert C.compose(["seed=6"])[0].seed == 6
    assert not cache.exists()


def test_where_the_cache_lives(monkeypatch, tmp_path):
    """The compose cache and the checkpoints' digest memo (harness.models.pretrained) share one root
    (harness.usercache), each in its own folder, whichever variable names it."""
    from harness.models.pretrained import _digest_memo

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "h"))
    assert compose_cache.cache_dir() == tmp_path / "h" / "compose" and _digest_memo() == tmp_path / "h" / "digests"
    monkeypatch.delenv("HARNESS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert compose_cache.cache_dir() == tmp_path / "x" / "harness" / "compose"
    assert _digest_memo() == tmp_path / "x" / "harness" / "digests"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compose_cache.cache_dir() == tmp_path / "home" / ".cache" / "harness" / "compose"
    assert _digest_memo() == tmp_path / "home" / ".cache" / "harness" / "digests"


def test_the_test_session_never_writes_to_the_users_cache():
    """tests/conftest.py points the cache at a temp dir of the session (subprocesses inherit it)."""
    import tempfile
    from pathlib import Path

    d = Path(os.environ["HARNESS_CACHE_DIR"])
    assert d.is_relative_to(tempfile.gettempdir()) and d.name.startswith("harness-test-cache-")


def test_override_groups_register_the_schemas_themselves():
    """harness.cli registers the ConfigStore only before Hydra's CLI or a compose (a cached plan needs none), so
    the strict check's group listing registers it itself when it runs first (it called a missing function)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = "from harness.config.overrides import groups; g = groups(); print(g['arm'], g['sweep'])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "'evi_po'" in proc.stdout and "'arms_x_seeds'" in proc.stdout
