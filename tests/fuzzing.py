"""Mutations of the shipped scenario and stack files, and the rule every `kvchaos validate`
outcome must follow. Shared by tests/scenario/test_fuzz.py (CI size, in-process) and
scripts/fuzz_validate.py (acceptance size, each case in its own forked `kvchaos validate`
process with a time and memory bound).

The rule: exit 0, or exit 2 where every error line names one of the case's files and a line
(``file:line: ...``), or names a file and a reason that concerns the whole file (not found, a
folder, too large, not a scenario file, ...); never a traceback, never another exit code, never
the text of a file named by ``stack:`` (a canary file checks that), never a value of a stack
file (a stack file whose values are marker strings checks that: the markers must not be printed).

Among the mutations: YAML tags with values they do not accept (``!!bool maybe``, ``!!int zz``,
``!!float 1e``, ``!!timestamp foo``, ``!!null x``, an integer of more than 4300 digits, ...).
"""

from __future__ import annotations

import copy
import functools
import os
import re
import resource
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))
STACKS = sorted((REPO / "compose").glob("*.yml"))
CANARY = "kvchaos-fuzz-canary-7Hq2"
#: Stack-file values a marker case writes; none may appear in any output.
MARKER = "kvmark-9Zr4"
MARKER_INT = 7351973
MARKERS = (MARKER, str(MARKER_INT))

#: Standard YAML tags given values their constructors refuse (each was a KeyError, ValueError,
#: IndexError or AttributeError traceback before chaos/yamlsource.py turned them into file:line).
BAD_TAGGED = ["!!bool maybe", "!!int zz", "!!float 1e", "!!timestamp foo", "!!timestamp 2024-13-01",
              "!!null x", "!!int 0x", "!!int 0b", "!!int 1:x", "!!float 1:x", "!!float ''", "!!bool ''",
              "!!int +", "!!binary \u00e9", "!!timestamp 2024-01-01T00:00:00+24:00", "9" * 4400,
              "!!str {a: 1}", "!!set x", "!!omap [1]", "!<tag:yaml.org,2002:int> zz"]

#: Messages that may name a file without a line: they concern the whole file or path.
WHOLE_FILE = re.compile(
    r"(file not found|no such file or folder|is a directory|not a regular file|not a file or folder|"
    r"file too large|text too large|cannot read|permission denied|too many levels of symbolic links|"
    r"not found \(a component|the path contains a NUL byte|the path is longer than|a path component is "
    r"longer than|not a usable path|no scenario files|more than \d+ files and folders|"
    r"not a scenario file|not a stack file|YAML)")


def _lines_of(text: str) -> list[str]:
    return text.splitlines(keepends=True) or [""]


# --- mutation operators (each: text -> text) -----------------------------------------------
TOKENS = [":", ": ", "- ", "-", "[", "]", "{", "}", ",", "&a ", "*a", "*b", "&b ", "<<: ", "<<: *a",
          "!!python/object:os.system ", "!!binary ", "!!set ", "!!omap ", "? ", "|", ">", '"', "'", "\t",
          "#", "\n", "  ", "    ", "%YAML 1.1\n", "---\n", "...\n", "~", "null", "true", "1e999", "-0",
          "0x1F", "2024-02-30", "12:30:00", ".inf", ".nan", "\\", "\u00e9", "\u200b", "\x00", "\x07",
          "\ufeff", "9" * 40, "x" * 300, "${ENGINE_PORT}", "${UNSET_VAR:?boom}", "$${X}", "${", "}"] + \
    [t + " " for t in BAD_TAGGED]

HOSTILE_PATHS = ["/etc/shadow", "/etc/passwd", "/etc", "/dev/zero", "/dev/null", "/proc/self/environ",
                 "/proc/self/mem", ".", "..", "", "~", "b" * 300 + ".yml", "/a" * 2100, '"x\\0y.yml"',
                 "missing.yml", "compose", "../scenarios", "stack.yml/x.yml", "/nonexistent/dir/s.yml"]


_KEY_VALUE = re.compile(r"^(\s*(?:- )?[A-Za-z_][\w-]*: )\S.*$")


def bomb(levels: int, width: int) -> str:
    lines = ["b0: &b0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@st.composite
def text_mutation(draw, text: str) -> str:
    lines = _lines_of(text)
    op = draw(st.sampled_from(["insert", "delete", "dup_line", "swap", "indent", "replace_line", "truncate",
                               "bomb", "cycle", "deep", "tokens", "bad_tag", "bad_tag"]))
    pos = draw(st.integers(0, len(text)))
    i = draw(st.integers(0, len(lines) - 1))
    if op == "insert":
        return text[:pos] + draw(st.text(max_size=12)) + text[pos:]
    if op == "tokens":
        junk = "".join(draw(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=4)))
        return text[:pos] + junk + text[pos:]
    if op == "delete":
        return text[:pos] + text[pos + draw(st.integers(1, 40)):]
    if op == "dup_line":
        return "".join(lines[: i + 1] + [lines[i]] * draw(st.integers(1, 3)) + lines[i + 1:])
    if op == "swap":
        j = draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
        return "".join(lines)
    if op == "indent":
        k = draw(st.integers(-4, 4))
        lines[i] = (" " * k + lines[i]) if k > 0 else lines[i][min(-k, len(lines[i]) - len(lines[i].lstrip(" "))):]
        return "".join(lines)
    if op == "replace_line":
        lines[i] = draw(st.text(max_size=30)) + "\n"
        return "".join(lines)
    if op == "truncate":
        return text[:pos]
    if op == "bad_tag":  # a `key: value` line's value replaced by a tagged value that does not construct
        keyed = [j for j, ln in enumerate(lines) if _KEY_VALUE.match(ln)]
        if not keyed:
            return text
        j = draw(st.sampled_from(keyed))
        lines[j] = _KEY_VALUE.match(lines[j]).group(1) + draw(st.sampled_from(BAD_TAGGED)) + "\n"
        return "".join(lines)
    if op == "bomb":
        return text + "x-bomb:\n" + "".join("  " + ln + "\n" for ln in bomb(draw(st.integers(3, 9)),
                                                                         draw(st.integers(2, 12))).splitlines())
    if op == "cycle":
        return text.replace("\n", "\n  loop: &cyc [*cyc]\n", 1) if draw(st.booleans()) else \
            "x-c: &c\n  a: 1\n  b:\n    c: *c\n" + text
    # deep
    depth = draw(st.integers(30, 3000))
    return text[:pos] + "[" * depth + "]" * depth + text[pos:]


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["-3s", "1m30s", "500ms", "end", "0", "latency", "kill", "hook",
                                           "engine-lmcache", "redis", "1e999", "2024-02-30", "x" * 300]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=10)
KEYS = ["kind", "link", "service", "start", "duration", "until", "name", "stream", "toxicity", "latency_ms",
        "requests", "faults", "phases", "checks", "workload", "tenants", "evidence", "stack", "services",
        "x-kvchaos", "command", "healthcheck", "depends_on", "environment", "links", "proxy", "bogus"]


def yaml_paths(node, prefix=()):
    """Every path (tuple of keys and indices) into a loaded YAML document, the root first."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from yaml_paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from yaml_paths(v, prefix + (i,))


@functools.lru_cache(maxsize=64)
def _parsed(text: str):
    """``text`` loaded with the bounded loader (chaos.yamlsource.load_yaml_text); ``_INVALID``
    when it refuses it. Cached: every case starts from one of the few shipped files, so their
    parse is done once, not once per case (callers copy before they change it)."""
    from chaos.yamlsource import ConfigError, load_yaml_text

    try:
        return load_yaml_text(text)[0]
    except ConfigError:
        return _INVALID


_INVALID = object()


@st.composite
def data_mutation(draw, text: str) -> str:
    """Parse (with the bounded loader: an earlier mutation may have made a bomb or a cycle),
    change one place (set, delete, add a key, rename a key), dump."""
    data = _parsed(text)
    if data is _INVALID:
        return text
    paths = [p for p in yaml_paths(data) if p]
    if not paths:
        return text
    data = copy.deepcopy(data)
    path = draw(st.sampled_from(paths))
    parent = data
    for step in path[:-1]:
        parent = parent[step]
    op = draw(st.sampled_from(["set", "delete", "add", "rename", "wrap"]))
    last = path[-1]
    if op == "set":
        parent[last] = draw(values)
    elif op == "delete":
        del parent[last]
    elif op == "add" and isinstance(parent, dict):
        parent[draw(st.sampled_from(KEYS))] = draw(values)
    elif op == "rename" and isinstance(parent, dict):
        parent[str(last)[:-1] + draw(st.sampled_from(["", "s", "_", "x"]))] = parent.pop(last)
    else:
        parent[last] = [parent[last]]
    try:
        return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
    except (yaml.YAMLError, ValueError, OverflowError):
        return text


@st.composite
def mutated(draw, text: str) -> str:
    for _ in range(draw(st.integers(1, 3))):
        text = draw(st.one_of(text_mutation(text), data_mutation(text)))
    return text


@dataclass
class Case:
    """The files of one case: ``scenario`` (validated), ``stack`` (the mutated stack, if any),
    ``canary`` (a file whose text must never be printed)."""

    dir: Path
    scenario: Path
    stack: Path | None = None
    canary: Path | None = None
    markers: tuple[str, ...] = ()


def _with_stack(text: str, stack: str) -> str:
    out, n = re.subn(r"(?m)^stack:.*$", lambda _m: f"stack: {stack}", text, count=1)
    return out if n else f"stack: {stack}\n" + text


@st.composite
def scenario_case(draw, workdir: Path) -> Case:
    """A shipped scenario, mutated; sometimes its ``stack:`` aimed at a hostile path or a canary."""
    src = draw(st.sampled_from(SCENARIOS))
    text = src.read_text()
    stack = str(REPO / "compose" / "reference.yml")
    canary = workdir / "secret.txt"
    canary.write_text(draw(st.sampled_from([
        f"root:$6$x${CANARY}:19000:0:99999:7:::\n", f"password: {CANARY}\n", f"{CANARY}: 1\n{CANARY}: 2\n",
        f"a: *{CANARY}\n", f"k: v\n  {CANARY}: [\n", f"- {CANARY}\n"])))
    target = draw(st.one_of(st.just(stack), st.just(stack), st.just(str(canary)), st.sampled_from(HOSTILE_PATHS)))
    text = _with_stack(text, target)
    text = draw(mutated(text))
    path = workdir / src.name
    _write(path, text)
    return Case(workdir, path, canary=canary)


@st.composite
def stack_case(draw, workdir: Path) -> Case:
    """A shipped stack file, mutated, named by a shipped scenario's ``stack:``."""
    src = draw(st.sampled_from(STACKS))
    stack = workdir / src.name
    _write(stack, draw(mutated(src.read_text())))
    scenario = draw(st.sampled_from(SCENARIOS))
    path = workdir / scenario.name
    path.write_text(_with_stack(scenario.read_text(), str(stack)))
    return Case(workdir, path, stack=stack)


#: Values a marker case puts into a stack file: each carries a marker, in the shapes that reach
#: the loader's error paths (a wrong type, a bad duration, address, selector, health check,
#: interpolation, service reference, ...).
marker_values = st.sampled_from([
    MARKER, MARKER_INT, -MARKER_INT, f"{MARKER}:{MARKER_INT}", f"127.0.0.1:{MARKER_INT}", f"{MARKER}:1",
    f"${{{MARKER}", f"{MARKER}${{", f"${{UNSET_{MARKER_INT}:?{MARKER}}}", f"${{X:?{MARKER}}}", f"$${{{MARKER}}}",
    f"${{-{MARKER}}}", f'{MARKER}{{le="x"}}', f'up{{a=~"{MARKER}("}}', f"{MARKER}s", f"1m{MARKER}", f"-{MARKER_INT}s",
    [MARKER], [MARKER, MARKER_INT], [f"CMD-{MARKER}"], ["CMD-SHELL", MARKER, MARKER], {"test": [MARKER]},
    {"condition": MARKER}, {"test": MARKER, "interval": MARKER}, {"listen": MARKER, "upstream": MARKER},
    True, 1.5, None, [], {},
])
MARKER_TAGS = ["!!bool", "!!int", "!!float", "!!timestamp", "!!null", "!!binary"]


@st.composite
def marker_stack_case(draw, workdir: Path) -> Case:
    """A shipped stack file with 1-6 of its values (never its keys) replaced by values carrying
    marker strings, sometimes a value given a tag it does not accept (``!!int kvmark-...``);
    named by a shipped scenario's ``stack:``. No marker may be printed: a stack file's values
    are never quoted (the key and what was expected are)."""
    src = draw(st.sampled_from(STACKS))
    data = copy.deepcopy(_parsed(src.read_text()))
    for _ in range(draw(st.integers(1, 6))):
        paths = [p for p in yaml_paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent = data
        for step in path[:-1]:
            parent = parent[step]
        parent[path[-1]] = copy.deepcopy(draw(marker_values))
    text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
    if draw(st.booleans()):
        lines = _lines_of(text)
        keyed = [j for j, ln in enumerate(lines) if _KEY_VALUE.match(ln)]
        if keyed:
            j = draw(st.sampled_from(keyed))
            lines[j] = _KEY_VALUE.match(lines[j]).group(1) + f"{draw(st.sampled_from(MARKER_TAGS))} {MARKER}\n"
            text = "".join(lines)
    stack = workdir / src.name
    _write(stack, text)
    scenario = draw(st.sampled_from(SCENARIOS))
    path = workdir / scenario.name
    path.write_text(_with_stack(scenario.read_text(), str(stack)))
    return Case(workdir, path, stack=stack, markers=MARKERS)


def _write(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8", "surrogatepass"))


# --- the rule ------------------------------------------------------------------------------
def problems_with(case: Case, exit_code: int, output: str) -> list[str]:
    """Why an outcome breaks the rule (empty: it follows it)."""
    bad = []
    if exit_code not in (0, 2):
        bad.append(f"exit code {exit_code}")
    if "Traceback" in output:
        bad.append("a traceback")
    if case.canary is not None and CANARY in output:
        bad.append("the text of a file named by stack: was printed")
    for marker in case.markers:
        if marker in output:
            bad.append(f"a value of the stack file ({marker}) was printed")
    files = {str(case.scenario)} | ({str(case.stack)} if case.stack else set())
    errors = [ln for ln in output.splitlines() if ln.strip() and not ln.endswith(": ok")]
    if exit_code == 2 and not errors:
        bad.append("exit 2 with no message")
    for ln in errors:
        if ln.startswith("warning: "):
            ln = ln[len("warning: "):]
            if not re.match(r"^.+?:\d+: ", ln):
                bad.append(f"a warning without a line: {ln[:200]}")
            continue
        m = re.match(r"^(?P<file>.+?):(?P<line>\d+)(:\d+)?: \S", ln)
        if m:
            if m.group("file") not in files and not m.group("file").startswith(str(case.dir)):
                # a file the case named (a hostile stack: path is reported under its own name)
                if not _named_by_case(m.group("file"), case):
                    bad.append(f"names a file that is not the case's: {ln[:200]}")
            continue
        m = re.match(r"^(?P<file>.+?): (?P<msg>.+)$", ln)
        if m and WHOLE_FILE.search(m.group("msg")):
            continue
        bad.append(f"neither file:line nor a whole-file reason: {ln[:200]}")
    return bad


def _named_by_case(file: str, case: Case) -> bool:
    """A file the case's scenario names (a hostile ``stack:`` is reported under its own name,
    shortened with "..." when long), or a shipped file."""
    if "..." in file or file.startswith(str(REPO)):
        return True
    try:
        text = case.scenario.read_text(errors="replace")
    except OSError:
        return False
    return file in text or os.path.basename(file) in text


# --- running a case ------------------------------------------------------------------------
@dataclass
class Outcome:
    exit_code: int
    output: str
    seconds: float
    max_rss_kib: int = 0
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)
    #: CPU seconds the validation itself used (user + system): what a case costs, whatever
    #: else the host runs (None: not measured).
    cpu_seconds: float | None = None


#: A case's bounds: CPU seconds of its own (a parser that loops or blows up spends them), and a
#: wall-clock bound far above it for a case that waits on nothing (a sleep, a blocking read).
#: The wall time alone is the host's: at load average 21 on two cores a shipped file's
#: mutation took 10.1 s of wall time (issue 34's loaded runs beside tests/scenario/test_fuzz.py).
CASE_CPU_SECONDS = 5.0
CASE_WALL_SECONDS = 60.0


def too_slow(out: Outcome, cpu_s: float = CASE_CPU_SECONDS, wall_s: float = CASE_WALL_SECONDS) -> str | None:
    """Why a validated case ran too long, or None: ``cpu_s`` or more of its own CPU time, or
    ``wall_s`` or more of wall time (or killed at the caller's timeout)."""
    if out.timed_out:
        return f"ran past its timeout ({out.seconds:.1f}s)"
    if out.cpu_seconds is not None and out.cpu_seconds >= cpu_s:
        return f"used {out.cpu_seconds:.1f} CPU seconds"
    if out.seconds >= wall_s:
        return f"took {out.seconds:.1f}s of wall time"
    return None


def validate_in_process(case: Case) -> Outcome:
    """`kvchaos validate` on the case through the CLI app, in this process (CI size): what
    typer's CliRunner.invoke does (its output capture, the exit code of SystemExit, an exception
    as a traceback), on the click command built once. CliRunner.invoke(app) rebuilds every
    command of the app from its annotations first (typer.main.get_command), a fifth of a case's
    time; the command is the same one (validate_forked's children share it too)."""
    from typer.testing import CliRunner

    if not _COMMAND:
        warm_up()
    runner = CliRunner()
    t0, cpu0 = time.monotonic(), time.thread_time()
    with runner.isolation() as (_stdout, _stderr, output):
        try:
            _COMMAND[0].main(["validate", str(case.scenario)], prog_name="kvchaos")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            tail = ""
        except Exception as exc:  # noqa: BLE001 - the rule's "never a traceback" must see it
            import traceback

            code = 1
            tail = "\nTraceback:\n" + "".join(traceback.format_exception(exc))
        else:
            tail = ""
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        out = output.getvalue().decode(runner.charset, "replace").replace("\r\n", "\n")
    return Outcome(code, out + tail, time.monotonic() - t0, cpu_seconds=time.thread_time() - cpu0)


_COMMAND: list = []


def warm_up() -> None:
    """Import everything `validate` needs and build the CLI once, so forked cases measure the
    case, not imports (a `kvchaos validate` process spends ~1 s importing)."""
    import typer

    from chaos.cli import app
    from chaos.scenario.loader import check_scenario

    check_scenario(SCENARIOS[0])
    _COMMAND[:] = [typer.main.get_command(app)]


def validate_forked(case: Case, *, timeout_s: float = CASE_WALL_SECONDS,
                    memory_limit_mib: int = 1024) -> Outcome:
    """`kvchaos validate` on the case in a child forked from this (warmed-up) process: its exit
    code, output, wall time, CPU seconds and peak resident memory (the child's own rusage). The child is
    killed after ``timeout_s`` and cannot map more than ``memory_limit_mib`` beyond what it
    started with (a runaway case fails instead of eating the machine)."""
    import psutil

    read, write = os.pipe()
    vms = psutil.Process().memory_info().vms
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: `kvchaos validate FILE`, as main() runs it
        try:
            os.close(read)
            os.dup2(write, 1)
            os.dup2(write, 2)
            limit = vms + memory_limit_mib * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            if not _COMMAND:
                warm_up()
            sys.argv = ["kvchaos", "validate", str(case.scenario)]
            try:
                _COMMAND[0].main(sys.argv[1:], prog_name="kvchaos")  # what main() -> app() runs
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # noqa: BLE001 - report it like the interpreter would
                import traceback

                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(locals().get("code", 70))
    os.close(write)
    os.set_blocking(read, False)
    chunks: list[bytes] = []
    timed_out = False
    status = ru = None
    while True:
        try:
            while chunk := os.read(read, 65536):
                chunks.append(chunk)
        except BlockingIOError:
            pass
        done, status, ru = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - t0 > timeout_s:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            _, status, ru = os.wait4(pid, 0)
            break
        time.sleep(0.002)
    try:
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    os.close(read)
    seconds = time.monotonic() - t0
    code = os.waitstatus_to_exitcode(status)
    return Outcome(code, b"".join(chunks).decode("utf-8", "replace"), seconds, ru.ru_maxrss, timed_out,
                   cpu_seconds=ru.ru_utime + ru.ru_stime)
