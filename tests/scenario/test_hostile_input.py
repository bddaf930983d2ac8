"""Hostile input: every bad file or path is an exit 2 naming file and line, fast, bounded, and
never quoting a file that a path names (issue: interrupted runs and hostile input)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chaos.scenario.cli import app
from chaos.scenario.loader import check_scenario, discover_scenarios, is_stack_file, load_scenario
from chaos.yamlsource import MAX_FILE_BYTES, ConfigError, load_yaml, load_yaml_text, path_problem

from .samples import GOOD

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
CANARY = "kvchaos-canary-Zq81"


def bomb(levels: int = 7, width: int = 9, indent: str = "") -> str:
    """The input that showed it: ~600 bytes that expand to width**levels values."""
    lines = [f"{indent}a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"{indent}a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def validate(*args: str):
    return runner.invoke(app, ["validate", *args])


def test_a_billion_laughs_scenario_fails_fast_at_the_alias(write):
    text = GOOD.replace("checks:\n", "x:\n" + bomb(indent="  ") + "checks:\n")
    path = write(text)
    t0 = time.process_time()  # the CPU it spends, not the host's load (tests/fuzzing.py)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = validate(str(path))
    assert time.process_time() - t0 < 2.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB
    assert r.exit_code == 2
    first_alias_line = text.splitlines().index(next(ln for ln in text.splitlines() if "*a3" in ln)) + 1
    assert f"{path}:{first_alias_line}:" in r.output and "billion laughs" in r.output


def test_a_billion_laughs_stack_file_fails_fast(write, scenario_dir):
    (scenario_dir / "stack.yml").write_text((scenario_dir / "stack.yml").read_text() + "x-bomb:\n" + bomb(indent="  "))
    r = validate(str(write(GOOD)))
    assert r.exit_code == 2
    assert "stack.yml:" in r.output and "takes the document past" in r.output
    assert "s.yaml:3: stack: the stack file" in r.output  # and the scenario's own line says where


def test_reference_stack_without_its_services_line(write, scenario_dir):
    """The inputs that showed it: a one-line typo (the `services:` line of compose/reference.yml
    deleted) gave a RecursionError traceback and exit 1."""
    text = (REPO / "compose" / "reference.yml").read_text()
    broken = "".join(line for line in text.splitlines(keepends=True) if line != "services:\n")
    (scenario_dir / "stack.yml").write_text(broken)
    r = validate(str(write(GOOD)))
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "refers to the node that contains it (a cycle)" in r.output


def test_a_stack_file_that_is_not_one_says_so(write, scenario_dir):
    (scenario_dir / "stack.yml").write_text("x-kvchaos: {}\nname: demo\n")
    r = validate(str(write(GOOD)))
    assert r.exit_code == 2
    assert "stack.yml:1: not a stack file: expected a compose-format mapping with `services:`" in r.output


@pytest.mark.parametrize("secret", [
    f"root:$6$salt${CANARY}:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n",   # a shadow-like file
    f"password: {CANARY}\ntoken: {CANARY}\n",                                     # a mapping, no services
    f"{CANARY}: 1\n{CANARY}: 2\n",                                                # a duplicate key
    f"a: *{CANARY}\n",                                                            # an undefined alias
    f"a: b\n  {CANARY}: [\n",                                                     # a syntax error
    f"when: 2024-02-30\nservices: {{a: {{command: [x]}}}}\n{CANARY}: 2024-13-45\n",  # a bad date
])
def test_errors_never_quote_a_file_named_by_stack(write, tmp_path, secret):
    """The input that showed it: `stack: /etc/shadow`, run as root, printed its lines."""
    target = tmp_path / "secret"
    target.write_text(secret)
    r = validate(str(write(GOOD.replace("stack: stack.yml", f"stack: {target}"))))
    assert r.exit_code == 2
    assert CANARY not in r.output, r.output
    assert f"{target}:" in r.output


def test_a_scenario_argument_that_is_no_scenario_is_not_quoted(tmp_path):
    target = tmp_path / "shadow"
    target.write_text(f"root:$6$salt${CANARY}:19000:0:99999:7:::\n")
    r = validate(str(target))
    assert r.exit_code == 2 and CANARY not in r.output
    assert ":1: not a scenario file: " in r.output
    target.write_text(f"{CANARY} and more text\non two lines\n")
    r = validate(str(target))
    assert r.exit_code == 2 and CANARY not in r.output
    assert "not a scenario file: expected a mapping with name, stack, phases and checks, found a text" in r.output


@pytest.mark.parametrize("stack, words", [
    ("b" * 300 + ".yml", "a path component is longer than 255 bytes (304)"),
    ("/a" * 2100, "the path is longer than 4096 bytes"),
    ('"x\\0y.yml"', "the path contains a NUL byte"),
    (".", "is a directory, expected a YAML file"),
    ("/dev/zero", "not a regular file (a device, FIFO or socket)"),
    ("stack.yml/x.yml", "a component of the path is a file"),
    ("missing.yml", "file not found"),
])
def test_bad_stack_paths_are_exit_2_at_the_stack_line(write, stack, words):
    """The input that showed it: a component over 255 bytes gave an OSError traceback."""
    r = validate(str(write(GOOD.replace("stack: stack.yml", f"stack: {stack}"))))
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert ":3: stack: stack file " in r.output and words in r.output


def test_bad_paths_on_the_command_line(tmp_path):
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    for arg, words in [("c" * 300, "longer than 255 bytes"), (str(tmp_path / "missing"), "no such file or folder"),
                       (str(fifo), "not a file or folder"), ("/dev/null", "not a file or folder")]:
        r = validate(arg)
        assert r.exit_code == 2 and "Traceback" not in r.output and words in r.output, (arg, r.output)


def test_a_folder_without_scenarios_is_exit_2(tmp_path):
    """The input that showed it: `validate` on an empty folder (or /etc) exited 0, silent."""
    (tmp_path / "stack.yml").write_text("services: {a: {command: [x]}}\n")  # a stack file only
    r = validate(str(tmp_path))
    assert r.exit_code == 2 and "no scenario files" in r.output


def test_nesting_and_size_bounds():
    with pytest.raises(ConfigError, match="nested deeper than 64 levels") as ei:
        load_yaml_text("a:\n" + "".join("  " * i + "- \n" for i in range(1, 70)))
    assert ei.value.line is not None
    with pytest.raises(ConfigError, match="nested deeper than 64"):
        load_yaml_text("[" * 10_000 + "]" * 10_000)
    with pytest.raises(ConfigError, match="text too large"):
        load_yaml_text("a: 1\n" * (MAX_FILE_BYTES // 4))


def test_a_large_file_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(2 * 1024 ** 3)  # sparse: 2 GiB that would take long to parse
    assert "file too large" in (path_problem(big) or "")
    t0 = time.process_time()
    with pytest.raises(ConfigError, match="file too large"):
        load_yaml(big)
    assert time.process_time() - t0 < 1


def test_many_aliases_and_expanded_values_are_bounded():
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * 1001) + "]\n"
    with pytest.raises(ConfigError, match="more than 1000 aliases"):
        load_yaml_text(text)
    text = "a: &a [" + ", ".join(["1"] * 999) + "]\nb: [" + ", ".join(["*a"] * 60) + "]\n"
    with pytest.raises(ConfigError, match="past 50000 values"):
        load_yaml_text(text)
    # compose-style anchors and merges as people write them stay fine
    data, _ = load_yaml_text("x-env: &env {A: '1'}\ns:\n  a: {environment: *env}\n  b: {<<: *env, B: '2'}\n")
    assert data["s"]["b"] == {"A": "1", "B": "2"}


def test_discovery_is_bounded_and_safe(tmp_path, monkeypatch):
    import chaos.scenario.loader as loader

    for i in range(30):
        (tmp_path / f"d{i}").mkdir()
    monkeypatch.setattr(loader, "MAX_DISCOVERED_ENTRIES", 10)
    with pytest.raises(ConfigError, match="more than 10 files and folders"):
        discover_scenarios(tmp_path)
    bomb_file = tmp_path / "bomb.yaml"
    bomb_file.write_text(bomb())
    assert is_stack_file(bomb_file) is False  # refused by the bounds, reported as a scenario


def test_five_independent_mistakes_in_one_pass(write):
    """Issue 12 acceptance 3: five mistakes of different kinds, all reported by one `validate`,
    each at its own line."""
    text = GOOD.replace("seed: 7", "seed: seven")                                    # 1 schema (line 4)
    text = text.replace("  - name: stall\n", "  - name: warm\n")                      # 2 duplicate phase (11)
    text = text.replace("link: engine-lmcache", "link: engine-lmcach")              # 3 unknown link (14)
    text = text.replace("  leaks:\n", "  leaks:\n    quiesce: 3\n"                     # 4 unknown key (22)
                        "  hit_recovery: {phases: [after]}\n"                          # 5 unknown phase (23)
                        )
    text = text.replace("checks:\n", "checks:\n  evidence: {}\n")
    text += "  isolation: {}\n"
    path = write(text.replace("  - name: warm\n    faults", "  - name: warm\n    faults"))
    text = path.read_text()
    lines = text.splitlines()
    r = validate(str(path))
    assert r.exit_code == 2
    got = [ln for ln in r.output.splitlines() if ln.startswith(f"{path}:")]
    want = {
        lines.index("seed: seven") + 1: "seed: Input should be a valid integer",
        lines.index("  - name: warm", lines.index("  - name: warm") + 1) + 1: "phase name 'warm' is used twice",
        next(i for i, ln in enumerate(lines) if "engine-lmcach" in ln) + 1: "unknown link 'engine-lmcach'",
        lines.index("    quiesce: 3") + 1: "unknown key",
        lines.index("  hit_recovery: {phases: [after]}") + 1: "unknown phase 'after'",
    }
    for line, words in want.items():
        assert any(g.startswith(f"{path}:{line}:") and words in g for g in got), (line, words, got)
    assert len({g.split(":")[1] for g in got}) >= 5  # each at its own line


def test_an_unknown_phase_reference_is_at_its_own_line_not_line_1(write):
    path = write(GOOD.replace("  leaks:\n", "  leaks:\n  hit_recovery: {phases: [warm, nope]}\n"))
    e = pytest.raises(ConfigError, load_scenario, path).value
    line = path.read_text().splitlines().index("  hit_recovery: {phases: [warm, nope]}") + 1
    assert (e.line, e.field) == (line, "checks.hit_recovery.phases[1]")
    assert "unknown phase 'nope'; the scenario's phases: warm, stall" in e.message


def test_warnings_for_a_hook_without_evidence_and_a_name_that_differs(write):
    text = GOOD.replace(
        "        duration: 1m30s\n",
        "        duration: 1m30s\n      - {kind: hook, service: engine, apply: {argv: ['true']}, until: end}\n")
    path = write(text, "other-name.yaml")
    check = check_scenario(path)
    assert check.ok, check.problems
    warnings = check.warning_lines()
    assert any(":1: name: the file is named 'other-name' but the scenario 'lookup-stall'" in w for w in warnings)
    line = next(i for i, ln in enumerate(text.splitlines()) if "kind: hook" in ln) + 1
    assert any(f":{line}: phases[1].faults[1]: a hook fault without `evidence`" in w for w in warnings), warnings
    r = validate(str(path))
    assert r.exit_code == 0
    # ... and (issue 34) the faults' windows go unchecked without the `evidence` check
    assert "checks: the scenario has faults but no `evidence` check" in r.output
    assert r.output.count("warning: ") == 3


def test_shipped_files_give_no_warnings():
    for path in discover_scenarios(REPO / "scenarios"):
        check = check_scenario(path)
        assert check.ok and check.warnings == [], (path, check.warning_lines(), [str(p) for p in check.problems])


MARK = "kvmark-Hq7x"


def _marked_stacks() -> dict[str, str]:
    """The reference stack file with one value (never a key) replaced by a value that carries a
    marker, one file per error path of the stack loader."""
    import copy

    import yaml

    base = yaml.safe_load((REPO / "compose" / "reference.yml").read_text())
    link = next(iter(base["x-kvchaos"]["links"]))
    dep = next(n for n, s in base["services"].items() if isinstance(s.get("depends_on"), dict))
    edits = {
        "a service that is not a mapping": (("services", "redis"), MARK),
        "an unknown service named": (("x-kvchaos", "engine"), MARK),
        "an unknown dependency": (("services", dep, "depends_on"), [MARK]),
        "a bad duration": (("services", "redis", "healthcheck", "interval"), MARK),
        "a bad health check": (("services", "redis", "healthcheck", "test"), [MARK, "x"]),
        "a bad link address": (("x-kvchaos", "links", link, "listen"), f"127.0.0.1:{MARK}"),
        "a required variable": (("services", "redis", "command"), ["redis-server", f"${{UNSET_{MARK[-4:]}:?{MARK}}}"]),
        "a bad interpolation": (("services", "redis", "command"), ["redis-server", f"${{{MARK}"]),
        "an unknown capability": (("x-kvchaos", "capabilities"), [MARK]),
        "a bad selector": (("x-kvchaos", "engine_metrics"), {"preemptions": f'{MARK}{{a=~"("}}'}),
        "a wrong type": (("x-kvchaos", "chunk_size"), MARK),
        "a wrong type in a list": (("services", "redis", "command"), [{"k": MARK}]),
        "an unknown union tag": (("x-kvchaos", "leak_sources"), [{"format": MARK, "url": MARK, "fields": {"a": MARK}}]),
    }
    out = {}
    for name, (path, value) in edits.items():
        data = copy.deepcopy(base)
        parent = data
        for step in path[:-1]:
            parent = parent[step]
        parent[path[-1]] = value
        out[name] = yaml.safe_dump(data, sort_keys=False)
    text = (REPO / "compose" / "reference.yml").read_text()
    for tag in ("!!int", "!!bool", "!!float", "!!timestamp", "!!null"):
        out[f"a {tag} value that does not construct"] = text.replace("  chunk_size: 256", f"  chunk_size: {tag} {MARK}")
    return out


@pytest.mark.parametrize("case", sorted(_marked_stacks()))
def test_no_command_prints_a_value_of_an_invalid_stack_file(tmp_path, case):
    """The input that showed it: `services.redis: Input should be a valid dictionary ... (got
    <the file's value>)`; a scenario's `stack:` may name any file on the host, so a stack
    file's errors name the key, the line and what was expected, never the value: in validate,
    run, list --stack, stack up and zoo, on stdout, stderr and in every file they write."""
    from chaos.cli import app as kvchaos

    stack = tmp_path / "stack.yml"
    stack.write_text(_marked_stacks()[case])
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    scenario = scenarios / "smoke.yaml"
    scenario.write_text((REPO / "scenarios" / "smoke.yaml").read_text().replace(
        "stack: ../compose/reference.yml", f"stack: {stack}"))
    reports = tmp_path / "reports"
    env = {"KVCHAOS_STATE_DIR": str(tmp_path / "state")}
    for args in (["validate", str(scenario)],
                 ["run", str(scenario), "--report-dir", str(reports)],
                 ["list", str(scenarios), "--stack", str(stack)],
                 ["stack", "up", str(stack)],
                 ["zoo", "--catalogue", str(scenarios), "--scenarios", "smoke", "--report-dir", str(reports),
                  "--out", str(reports / "zoo")]):
        r = runner.invoke(kvchaos, args, env=env)
        assert r.exit_code == 2, (args, r.output)
        assert f"{stack}:" in r.output, (args, r.output)
        assert MARK not in r.output, (args, r.output)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != stack]
    assert not [p for p in written if MARK in p.read_text(errors="replace")]


def test_liveness_names_phases_and_faults_that_exist_at_their_own_line(write):
    """allowed_failures and phase_deadlines (issue 34's authoring gaps) name a phase or a fault:
    a name the scenario lacks is an error at its line, listing what there is."""
    good = GOOD.replace("  liveness: {request_deadline_s: 30}\n",
                        "  liveness:\n    request_deadline_s: 30\n"
                        "    phase_deadlines: [{phase: stall, request_deadline_s: 1m}]\n"
                        "    allowed_failures: [{fault: latency-0, phase: stall, at_most: 2}]\n")
    load_scenario(write(good))
    path = write(good.replace("{fault: latency-0,", "{fault: lag,"))
    e = pytest.raises(ConfigError, load_scenario, path).value
    line = next(i for i, ln in enumerate(path.read_text().splitlines()) if "fault: lag" in ln) + 1
    assert (e.line, e.field) == (line, "checks.liveness.allowed_failures[0].fault"), (e.line, e.field)
    assert "unknown fault 'lag'; the scenario's faults: latency-0" in e.message
    path = write(good.replace("{phase: stall, request_deadline_s: 1m}", "{phase: stal, request_deadline_s: 1m}"))
    e = pytest.raises(ConfigError, load_scenario, path).value
    assert e.field == "checks.liveness.phase_deadlines[0].phase" and "unknown phase 'stal'" in e.message
    for bad, words in (("{error_matches: '(('}", "not a regular expression"),
                       ("{at_most: 2}", "give at least one of phase, fault, error_matches")):
        path = write(good.replace("{fault: latency-0, phase: stall, at_most: 2}", bad))
        e = pytest.raises(ConfigError, load_scenario, path).value
        assert words in e.message, e.message
