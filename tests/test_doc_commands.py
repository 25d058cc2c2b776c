"""Every shell command of the tutorial and the how-tos (and of the README's quick start), pasted through `bash -c`
as a reader pastes it, exits 0 and leaves no file but those it names (`--out`, `--record-trace`, a script): a
command that writes a stray file, such as `asgd` from an unquoted `--compare dcasgd-a>asgd`, fails.

A page's commands run in order in one temporary directory that holds what a clone holds for them (links to
`experiments/`, the Makefile, `pyproject.toml`, the venv). The documented budgets take minutes to an hour, so
each command runs in a cheap but real form, chosen in CHEAP with the reason: flags appended after the documented
ones (the last one given wins), parsed by the shell and by stalegrad like the rest; a grid's file is checked
whole (`--dry-run`), then a copy cut to one cell runs for real, so that the report after it reads a real run.
`stalegrad` and `python` on the test's PATH are clients of one warm process (stalegrad, torch and matplotlib
imported once) that forks for each command and runs `stalegrad.cli.main`, or the script, with the arguments the
shell parsed: a fresh interpreter would cost seconds of imports a command. SKIP lists what needs the network.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"docs/tutorial.md": None, **{f"docs/howto/{p.name}": None for p in sorted((ROOT / "docs/howto").glob("*.md"))},
         "README.md": "Quick start"}                     # the README: its quick start only
LANGUAGES = ("bash", "sh", "shell", "console")
EPOCHS = ["--epochs", "0.05"]   # every rule's first updates, evaluations and files, in a second or two
CHEAP = [  # (pattern of the command, arguments appended to each stalegrad call in it, why)
    (r"^stalegrad train --resume \S+ --epochs", ["--epochs", "0.1"],
     "extends the run: twice the first train's 0.05 epochs, as the page's 60 doubles its 30"),
    (r"^stalegrad train --resume \S+\s+#", [], "continues the finished 0.05-epoch run as written"),
    (r"^stalegrad (train|compare) |^for seed in", EPOCHS,
     "the documented budgets (5 to 30 epochs, 60 trainings in the protocol's loop) take minutes each"),
    (r"^stalegrad grid ", [], "the file checked whole with --dry-run, then a copy cut to the first value of every "
                              "axis (one cell), at 0.05 epochs, run for real; the report after it reads that run"),
    (r"^python \S+\.py", [], "the page's script, with its epochs=5 cut to epochs=0.3"),
    (r"^make ", [], "make -n: `make demo` installs and trains for minutes, `make test` is this whole suite"),
]
SKIP = {r"^stalegrad data fetch ": "downloads from the network"}
SCRIPT_CUTS = {"epochs=5,": "epochs=0.3,"}
# numba's kernels would compile in every command, and the simulator measure its thread counts: the bits and the
# paths exercised are the same without both
QUICK = {"STALEGRAD_KERNELS": "torch", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


# ---------------------------------------------------------------- the commands of a page

def blocks(page: str, section: str | None) -> list[tuple[str, str]]:
    """(language, text) of each fenced shell block of ``page`` (of its ``## section`` only, when given), and of
    each ```python block as ("python", text) for the scripts a command runs."""
    text = (ROOT / page).read_text()
    if section:
        start = text.index(f"\n## {section}\n")
        text = text[start:text.find("\n## ", start + 1)]
    return re.findall(r"^```(\w+)\n(.*?)^```", text, flags=re.M | re.S)


def complete(text: str) -> bool:
    return subprocess.run(["bash", "-n", "-c", text], capture_output=True).returncode == 0


def commands(text: str, console: bool) -> list[str]:
    """The commands of a block, each as many lines as the shell needs to parse it (continuations, loops); a
    console block's commands are its lines after `$ `. Comment lines are no command."""
    out, pending = [], ""
    for line in text.splitlines():
        if console and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        pending += line + "\n"
        if not line.endswith("\\") and complete(pending):    # bash -n takes a last `\` for a complete line
            if pending.strip() and not pending.lstrip().startswith("#"):
                out.append(pending.rstrip("\n"))
            pending = ""
    assert not pending, f"a command that never ends: {pending!r}"
    return out


def page_steps(page: str) -> list[tuple[str, str | None]]:
    """(command, the last ```python block before it) of a page, in order."""
    steps, script = [], None
    for language, text in blocks(page, PAGES[page]):
        if language == "python":
            script = text
        elif language in LANGUAGES:
            steps += [(c, script) for c in commands(text, language == "console")]
    return steps


def rule(command: str):
    for pattern, why in SKIP.items():
        if re.search(pattern, command):
            return None, why
    for pattern, extra, why in CHEAP:
        if re.search(pattern, command):
            return extra, why
    return [], "as written"


def outputs(command: str) -> set[str]:
    """The top-level names a command may create in its directory: its --out, --record-trace and script."""
    named = re.findall(r"--(?:out|record-trace)[ =]\"?([^\s\"]+)", command) + re.findall(r"^python (\S+)", command)
    return {n.split("/")[0] for n in named}


# ---------------------------------------------------------------- the warm process and its clients

CLIENT = """#!{python} -I
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["DOC_COMMANDS_SERVER"])
request = {{"tool": {tool!r}, "argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}
socket.send_fds(s, [json.dumps(request).encode()], [0, 1, 2])
s.shutdown(socket.SHUT_WR)
code = s.recv(64)
sys.exit(int(code) if code else 1)
"""


PRELOAD = ("torch", "matplotlib.pyplot", "sklearn.datasets", "stalegrad.cli", "stalegrad.run.training",
           "stalegrad.runtimes.sim", "stalegrad.runtimes.vectorised", "stalegrad.runtimes.local", "stalegrad.data",
           "stalegrad.models", "stalegrad.study.report", "stalegrad.study.grid", "stalegrad.study.plot",
           "stalegrad.core.prober")


def serve(path: str) -> None:
    """The warm process: each connection brings a command's arguments, directory and environment with its stdin,
    stdout and stderr; a forked child runs it there and sends back its exit code."""
    import importlib
    import signal
    import stalegrad  # noqa: F401  (first: it pins the numerics torch reads when it starts)
    import matplotlib
    matplotlib.use("Agg")
    for module in PRELOAD:     # imported, never run: torch's threads must not start before a fork
        importlib.import_module(module)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)        # the children reap themselves
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        while chunk := conn.recv(1 << 20):
            data += chunk
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)    # subprocess (a grid's cells) waits for its own
            server.close()
            code = child(json.loads(data), fds)
            conn.sendall(str(code).encode())
            os._exit(code)
        conn.close()
        for fd in fds:
            os.close(fd)


def child(request: dict, fds: list[int]) -> int:
    import runpy
    import traceback
    from multiprocessing import process
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    process.ORIGINAL_DIR = request["cwd"]      # as a python started there records it
    os.environ.clear()
    os.environ.update(request["env"])
    try:
        if request["tool"] == "python":
            sys.argv = request["argv"]
            runpy.run_path(os.path.abspath(sys.argv[0]), run_name="__main__")   # __main__.__file__: absolute
            return 0
        return cheap(request["argv"], json.loads(os.environ.get("DOC_COMMANDS_APPEND", "[]")))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def cheap(argv: list[str], extra: list[str]) -> int:
    """``stalegrad ARGV`` in its cheap form: ``extra`` appended; a grid checked whole, then run cut."""
    from stalegrad.cli import main
    from stalegrad.study.grid import toml_value
    if argv[:1] != ["grid"]:
        return main(argv + extra)
    code = main(argv + ["--dry-run"])
    if code:
        return code
    grid = tomllib.loads(Path(argv[1]).read_text())
    grid["axes"] = {k: v[:1] for k, v in grid["axes"].items()}
    grid["fixed"]["epochs"] = float(EPOCHS[1])
    cut = Path(os.environ["DOC_COMMANDS_SCRATCH"]) / f"cut-{Path(argv[1]).name}"
    cut.write_text("".join(f"[{table}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items()) + "\n"
                           for table, keys in grid.items()))
    return main(["grid", str(cut), *argv[2:], "--no-report"])     # the page's next command reports


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """The warm process and a bin/ of clients (stalegrad, python; make as make -n) to put first on PATH."""
    where = tmp_path_factory.mktemp("warm")
    sock = str(where / "s")
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); "
                             f"import test_doc_commands as t; t.serve({sock!r})"],
                            stdout=subprocess.PIPE, start_new_session=True, text=True, env={**os.environ, **QUICK})
    try:
        assert proc.stdout.readline() == "ready\n"
        (where / "bin").mkdir()
        for tool in ("stalegrad", "python"):
            (where / "bin" / tool).write_text(CLIENT.format(python=sys.executable, tool=tool))
            (where / "bin" / tool).chmod(0o755)
        if shutil.which("make"):
            (where / "bin" / "make").write_text(f"#!/bin/sh\nexec {shutil.which('make')} -n \"$@\"\n")
            (where / "bin" / "make").chmod(0o755)
        (where / "scratch").mkdir()
        yield {"pid": proc.pid, "DOC_COMMANDS_SERVER": sock, "DOC_COMMANDS_SCRATCH": str(where / "scratch"),
               "PATH": f"{where / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    finally:
        os.killpg(proc.pid, 9)      # the process group this fixture started: the warm process and its children
        proc.wait()


# ---------------------------------------------------------------- the tests

def fashion_mnist() -> bool:
    from stalegrad.data import find_dataset_dir
    try:
        find_dataset_dir("fashion-mnist")
        return True
    except Exception:
        return False


def pasted(command: str, cwd: Path, env: dict, warm: dict, timeout: float = 300) -> tuple[int, str]:
    """``bash -c COMMAND``: its exit code and stderr. Past ``timeout`` the shell's group and the warm process's
    (which runs what the shell asked of it) are killed: the command failed, and so do the pages after it."""
    shell = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        _, stderr = shell.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for group in (shell.pid, warm["pid"]):
            os.killpg(group, 9)
        _, stderr = shell.communicate()
        return -9, f"killed after {timeout} s\n{stderr}"
    return shell.returncode, stderr


@pytest.mark.parametrize("page", PAGES)
def test_every_command_of_the_page_runs_as_pasted_and_leaves_no_stray_file(page, warm, tmp_path):
    steps = page_steps(page)
    if not steps:
        pytest.skip(f"{page} has no shell command")
    if any("fashion-mnist" in c for c, _ in steps) and not fashion_mnist():
        pytest.skip("the page's commands read Fashion-MNIST: `make data`, or `stalegrad data fetch fashion-mnist`")
    for name in ("experiments", "Makefile", "pyproject.toml", ".venv"):
        if (ROOT / name).exists():
            (tmp_path / name).symlink_to(ROOT / name)
    allowed = {p.name for p in tmp_path.iterdir()}
    env = {**os.environ, **{k: v for k, v in warm.items() if k != "pid"}, **QUICK}
    for command, script in steps:
        extra, why = rule(command)
        if extra is None:
            print(f"skipped ({why}): {command}")
            continue
        run_file = re.match(r"^python (\S+\.py)", command)
        if run_file and not (tmp_path / run_file[1]).exists():
            assert script, f"{page}: {command!r} runs a script, and no ```python block comes before it"
            for documented, cut in SCRIPT_CUTS.items():
                script = script.replace(documented, cut)
            (tmp_path / run_file[1]).write_text(script)
        code, stderr = pasted(command, tmp_path, {**env, "DOC_COMMANDS_APPEND": json.dumps(extra)}, warm)
        assert code == 0, f"{page}: {command!r} ({why}) exited {code}:\n{stderr[-3000:]}"
        allowed |= outputs(command)
        stray = {p.name for p in tmp_path.iterdir()} - allowed
        assert not stray, f"{page}: {command!r} left {sorted(stray)} in its directory"


def test_every_cheap_form_and_skip_serves_a_command_of_the_pages():
    documented = [c for page in PAGES for c, _ in page_steps(page)]
    for pattern in [p for p, _, _ in CHEAP] + list(SKIP):
        assert any(re.search(pattern, c) for c in documented), f"no documented command matches {pattern!r}"


def test_no_documented_command_redirects_into_a_file_by_accident():
    """A `>` inside an argument (`--compare A>B`) is a redirection unless quoted; checked in every page's shell
    blocks (the site's, the README and experiments/README.md), on the text outside quotes."""
    pages = [ROOT / "README.md", ROOT / "experiments/README.md"] + \
        [p for p in (ROOT / "docs").rglob("*.md") if (ROOT / "docs/results") not in p.parents]
    found = []
    for page in pages:
        for language, text in re.findall(r"^```(\w+)\n(.*?)^```", page.read_text(), flags=re.M | re.S):
            if language in LANGUAGES:
                bare = re.sub(r"'[^']*'|\"[^\"]*\"|#.*", "", text)
                found += [f"{page.relative_to(ROOT)}: {m}" for m in re.findall(r"\S*[\w-]>[\w.]\S*", bare)]
    assert not found, found
