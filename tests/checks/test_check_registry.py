import pytest

from chaos.checks import CheckResult, Snapshots, combine, get, names, run_checks
from chaos.scenario.checks import ChecksConfig


def _r(v):
    return CheckResult(name="x", verdict=v, summary="")


def test_combine_takes_the_worst():
    assert combine([_r("passed"), _r("unknown"), _r("passed")]) == "unknown"
    assert combine([_r("unknown"), _r("failed"), _r("passed")]) == "failed"
    assert combine([_r("passed")]) == "passed"


def test_registry_names_are_the_yaml_keys():
    assert names() == sorted(ChecksConfig.model_fields)
    with pytest.raises(KeyError, match="known checks"):
        get("nope")


def test_run_checks_with_scenario_models(hb):
    hb.request("w-1", [1, 2], [3])
    cfg = ChecksConfig.model_validate({"recompute_equivalence": {}, "liveness": {"request_deadline_s": "30s"}})
    results = run_checks(hb.ops, Snapshots(expected={"w-1": [3]}),
                         {n: getattr(cfg, n) for n in cfg.enabled()})
    assert [(r.name, r.verdict) for r in results] == [("recompute_equivalence", "passed"), ("liveness", "passed")]


def test_a_crashing_check_is_unknown(hb):
    hb.request("w-1", [1, 2], [3])
    hb.ops[1]["value"]["cached_token_stats"] = {"local_cache_hit_tokens": "lots"}
    (r,) = run_checks(hb.ops, Snapshots(expected={"w-1": [3]}), {"recompute_equivalence": None})
    assert r.verdict == "unknown" and r.summary.startswith("check crashed")


def test_history_as_op_models(hb):
    from chaos.history import Op
    hb.request("w-1", [1, 2], [4])
    ops = [Op.model_validate(o) for o in hb.ops]
    (r,) = run_checks(ops, Snapshots(expected={"w-1": [3]}), {"recompute_equivalence": {}})
    assert r.verdict == "failed"
