import pytest

from chaos.checks import CheckResult, Snapshots, combine, get, names, run_checks
from chaos.checks.config import ChecksConfig


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


def test_register_records_name_function_model_and_first_doc_line():
    from pydantic import BaseModel

    from chaos.checks import registry

    class Cfg(BaseModel):
        level: int = 3

    def probe(history, snapshots, config):
        """First line.

        More."""
        return CheckResult(name="probe-x", verdict="passed", summary=str(config.level))

    try:
        assert registry.register("probe-x", Cfg)(probe) is probe
        registry.register("probe-x", Cfg)(probe)  # the same function again is fine
        spec = get("probe-x")
        assert (spec.name, spec.fn, spec.config_model, spec.doc) == ("probe-x", probe, Cfg, "First line.")
        with pytest.raises(ValueError, match="check 'probe-x' is registered twice"):
            registry.register("probe-x", Cfg)(lambda h, s, c: None)
        # A check asked for with no config gets its model's defaults, not None.
        (r,) = run_checks([], Snapshots(), {"probe-x": None})
        assert (r.name, r.verdict, r.summary) == ("probe-x", "passed", "3")
        (r,) = run_checks([], Snapshots(), {"probe-x": Cfg(level=5)})
        assert r.summary == "5"

        def undocumented(history, snapshots, config):
            raise RuntimeError("broken checker")

        registry.register("probe-y", Cfg)(undocumented)
        assert get("probe-y").doc == ""
        (r,) = run_checks([], Snapshots(), {"probe-y": {}})
        assert (r.name, r.verdict) == ("probe-y", "unknown")
        assert r.summary == "check crashed: RuntimeError: broken checker"
        assert r.details == {"exception": "RuntimeError('broken checker')"}
    finally:
        registry._REGISTRY.pop("probe-x", None)
        registry._REGISTRY.pop("probe-y", None)


def test_unknown_check_lists_the_known_ones():
    with pytest.raises(KeyError) as err:
        get("nope")
    assert err.value.args[0] == f"unknown check 'nope'; known checks: {', '.join(names())}"


def test_coerce_config_accepts_none_dict_own_and_other_models():
    from pydantic import BaseModel

    from chaos.checks.config import LeaksConfig
    from chaos.checks.registry import coerce_config

    class Other(BaseModel):
        quiesce_s: float = 4.0

    assert coerce_config(None, LeaksConfig) == LeaksConfig()
    own = LeaksConfig(quiesce_s=3)
    assert coerce_config(own, LeaksConfig) is own
    assert coerce_config(Other(), LeaksConfig).quiesce_s == 4.0
    assert coerce_config({"quiesce_s": 2}, LeaksConfig).quiesce_s == 2
