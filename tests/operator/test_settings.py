"""Operator configuration from LLMTRAIN_OPERATOR_* variables."""

import pytest
from llmtrain_operator.settings import ConfigError, OperatorSettings, from_env


def test_defaults_and_overrides():
    assert from_env({}) == OperatorSettings()
    got = from_env({"LLMTRAIN_OPERATOR_NAMESPACE": "ml", "LLMTRAIN_OPERATOR_RESYNC_SECONDS": "2.5",
                    "LLMTRAIN_OPERATOR_PROBES": "off", "LLMTRAIN_OPERATOR_LEADER_ELECTION": "no",
                    "LLMTRAIN_OPERATOR_MAX_CONCURRENT_RECONCILES": "3"})
    assert (got.namespace, got.resync_seconds, got.probes_enabled, got.leader_election) == ("ml", 2.5, False, False)
    assert got.max_concurrent_reconciles == 3


@pytest.mark.parametrize(("env", "named"), [
    ({"LLMTRAIN_OPERATOR_RESYNC_SECONDS": "soon"}, "LLMTRAIN_OPERATOR_RESYNC_SECONDS"),
    ({"LLMTRAIN_OPERATOR_METRICS_PORT": "-1"}, "LLMTRAIN_OPERATOR_METRICS_PORT"),
    ({"LLMTRAIN_OPERATOR_LEADER_ELECTION": "maybe"}, "LLMTRAIN_OPERATOR_LEADER_ELECTION"),
    ({"LLMTRAIN_OPERATOR_STANDALONE": "true"}, "unknown setting.*LLMTRAIN_OPERATOR_STANDALONE"),
    ({"LLMTRAIN_OPERATOR_LEASE_DURATION_SECONDS": "0"}, "LLMTRAIN_OPERATOR_LEASE_DURATION_SECONDS=.0. must be greater than 0"),
    ({"LLMTRAIN_OPERATOR_RENEW_DEADLINE_SECONDS": "15"}, "RENEW_DEADLINE_SECONDS .15. must be less than"),
    ({"LLMTRAIN_OPERATOR_RETRY_PERIOD_SECONDS": "9"}, "RETRY_PERIOD_SECONDS .9. must be well below"),
    ({"LLMTRAIN_OPERATOR_RESYNC": "5"}, "LLMTRAIN_OPERATOR_RESYNC"),
    ({"LLMTRAIN_OPERATOR_MAX_CONCURRENT_RECONCILES": "0"}, "LLMTRAIN_OPERATOR_MAX_CONCURRENT_RECONCILES=.0. must be at least 1"),
    ({"LLMTRAIN_OPERATOR_API_THREADS": "0"}, "LLMTRAIN_OPERATOR_API_THREADS"),
])
def test_a_bad_setting_is_an_error_naming_the_variable(env, named):
    with pytest.raises(ConfigError, match=named):
        from_env(env)
