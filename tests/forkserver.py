"""A preloaded interpreter for the tests' `python -m harness ...` runs: each run pays ~9 s importing torch,
transformers and TRL before its first line of work (`phases (s): ... imports 8.9` on a debug=tiny run whose training
takes 7 s), and the suites start hundreds of them. This server imports those packages once; each run is then a fork
of it that runs `python -m <module> <args>` as the interpreter's `-m` switch does (runpy._run_module_as_main), with
the run's own cwd, environment, stdin, stdout and stderr. The harness itself is imported fresh in every run: the
server imports third-party packages only, and runs no code of the harness.

What stays as in a fresh process, by construction:
- the environment: `Server.accepts` sends a run here only when its environment equals the server's but for
  variables read at run time by the harness or a test's own code (HARNESS_*, REWARD_*) or by none (PYTEST_*); any
  other difference (OMP_NUM_THREADS, HF_*, WANDB_*, PYTHONHASHSEED, ...: read as the packages import) runs a fresh
  interpreter, and so does a run that names trackio (the harness sets TRACKIO_DIR before trackio imports);
- the exit status: a run's code, or minus the signal that ended it, as subprocess reports it;
- the end: non-daemon threads joined, atexit functions run, the streams flushed, as at the interpreter's exit.

What differs: import-time warnings of the preloaded packages are not printed again; the runs share the server's
str hash seed. Runs started otherwise (tests that signal a run, `-X importtime`, other environments) start a fresh
interpreter. HARNESS_TEST_FORKSERVER=0 turns the server off.

Protocol (a Unix socket): the client sends a length-prefixed JSON request (module, args, cwd, env) with its stdin,
stdout and stderr as SCM_RIGHTS fds; the server forks a monitor, which forks the run, sends `{"pid": P}`, waits for
it and sends `{"status": S}` (waitpid's status)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import shutil
import tempfile
import threading
import time
from pathlib import Path

PRELOAD = ("torch", "transformers", "transformers.processing_utils", "transformers.image_processing_utils",
           "transformers.trainer", "trl", "peft", "datasets", "accelerate", "hydra", "omegaconf", "safetensors",
           "PIL.Image", "numpy")
# read at run time (by the harness, its fault injection, or a test's own reward code), or by no one (pytest's own,
# e.g. PYTEST_CURRENT_TEST, which changes with every test): may differ per run
RUNTIME_ENV = ("HARNESS_", "REWARD_", "PYTEST_")
# preloaded packages the harness configures through the environment before they import (TRL imports trackio, which
# reads TRACKIO_DIR once; harness.trackers and harness.export set it to <output_root>/trackio first): a run whose
# arguments name one (logger=trackio, --to trackio) starts a fresh interpreter
SET_BEFORE_IMPORT = ("trackio",)


def _send(conn: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    payload = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(conn, [payload], fds)
    else:
        conn.sendall(payload)


def _recv(conn: socket.socket, maxfds: int = 0) -> tuple[dict | None, list[int]]:
    buf, fds = b"", []
    while len(buf) < 4 or len(buf) < 4 + struct.unpack("!I", buf[:4])[0]:
        if maxfds and not fds:
            chunk, got, _, _ = socket.recv_fds(conn, 1 << 16, maxfds)
            fds = list(got)
        else:
            chunk = conn.recv(1 << 16)
        if not chunk:
            return None, fds
        buf += chunk
    return json.loads(buf[4:4 + struct.unpack("!I", buf[:4])[0]]), fds


# --- the server


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish(code: int) -> None:
    """What the interpreter does at its exit, then the exit."""
    try:
        threading._shutdown()  # joins the non-daemon threads, as Py_FinalizeEx does first
    except BaseException:  # noqa: BLE001
        pass
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            code = code or 120
    os._exit(code)


def _run(req: dict, fds: list[int]) -> None:
    """In the forked run: become `python -m module args` in req's cwd and environment; never returns."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.path[0] = os.getcwd()
    sys.argv = ["-m", *req["args"]]
    import runpy

    try:
        runpy._run_module_as_main(req["module"])
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:  # noqa: BLE001  (an uncaught exception: its traceback and 1, as the interpreter)
        exc.__traceback__ = exc.__traceback__.tb_next  # from runpy's frame on, as `python -m` prints it
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = 1
    _finish(code)


def _monitor(conn: socket.socket, req: dict, fds: list[int]) -> None:
    """In the forked monitor: fork the run, say its pid, wait for it, say its status; never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run(req, fds)
    for fd in fds:
        os.close(fd)
    code = 0
    try:
        _send(conn, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send(conn, {"status": status})
    except BaseException:  # noqa: BLE001  (the client is gone: the run goes on, as a subprocess would)
        code = 1
    os._exit(code)


def serve(path: str) -> None:
    for name in PRELOAD:
        __import__(name)
    import trl

    for name in ("GRPOConfig", "GRPOTrainer", "SFTConfig", "SFTTrainer"):
        getattr(trl, name)  # trl is a lazy module: its trainers are what costs the seconds

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the monitors are reaped by the kernel
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(2.0)
    print("ready", flush=True)
    while os.getppid() == parent:  # the pytest process that started it is gone: so is the server
        try:
            conn, _ = listener.accept()
        except (socket.timeout, InterruptedError):
            continue
        conn.settimeout(None)
        req, fds = _recv(conn, maxfds=3)
        if req is None or req.get("stop"):
            break
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            _monitor(conn, req, fds)
        for fd in fds:
            os.close(fd)
        conn.close()
    listener.close()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)  # its socket and log: nothing left in /tmp


# --- the client (the pytest process)


class Server:
    """One preloaded interpreter per pytest process, started at the first run it serves."""

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self.dir = tempfile.mkdtemp(prefix="hfs-")
        self.path = os.path.join(self.dir, "sock")
        with open(os.path.join(self.dir, "server.log"), "w") as log:  # the server's own stderr
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), self.path],
                                         cwd=Path(__file__).resolve().parent.parent, env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the test fork server did not start: {Path(self.dir, 'server.log').read_text()}")

    def accepts(self, env: dict[str, str], args: tuple[str, ...] | list[str] = ()) -> bool:
        if any(word in a for a in args for word in SET_BEFORE_IMPORT):
            return False
        keys = set(env) | set(self.env)
        return all(env.get(k) == self.env.get(k) for k in keys if not k.startswith(RUNTIME_ENV))

    def run(self, module: str, args: list[str], cwd: Path, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess:
        """subprocess.run([python, -m, module, *args], capture_output=True, text=True, timeout=...) by a fork."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            _send(conn, {"module": module, "args": list(args), "cwd": str(cwd), "env": env}, [null, out_w, err_w])
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
        readers = [threading.Thread(target=_drain, args=(fd, chunks[fd]), daemon=True) for fd in (out_r, err_r)]
        for t in readers:
            t.start()
        deadline = time.monotonic() + timeout
        conn.settimeout(timeout)
        pid = status = None
        try:
            pid = _recv(conn)[0]["pid"]
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            status = _recv(conn)[0]["status"]
        except socket.timeout:
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            for t in readers:
                t.join(5)
            raise subprocess.TimeoutExpired([module, *args], timeout) from None
        except TypeError:  # the connection closed without a pid or a status: the monitor died
            raise RuntimeError(f"the test fork server lost the run {module} {args}: see {self.dir}/server.log") from None
        finally:
            conn.close()
        for t in readers:
            t.join()
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        text = [_text(b"".join(chunks[fd])) for fd in (out_r, err_r)]
        return subprocess.CompletedProcess([sys.executable, "-m", module, *args], code, *text)

    def stop(self) -> None:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(self.path)
                _send(conn, {"stop": True})
            self.proc.wait(10)
        except Exception:  # noqa: BLE001
            self.proc.kill()


def _drain(fd: int, into: list[bytes]) -> None:
    with os.fdopen(fd, "rb", buffering=0) as f:
        while chunk := f.read(1 << 16):
            into.append(chunk)


def _text(data: bytes) -> str:
    """As subprocess's text mode: the locale's encoding, universal newlines."""
    import io
    import locale

    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


if __name__ == "__main__":
    serve(sys.argv[1])
